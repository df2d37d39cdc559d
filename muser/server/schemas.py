"""OpenAI request shapes: validated, strict.

Owns: what a well-formed /v1/chat/completions, /v1/completions, /tokenize and
/detokenize body is -- types are strict (no "1" for 1, no 1 for true), unknown
fields are refused, values are range-checked, and OpenAI parameters the server
does not implement are refused unless they carry their no-op default.  Does
not own: limits that depend on the loaded model (max_context, vocab; app.py
checks those), HTTP status codes (http_errors.py) or the JSON the server sends
back -- completions, chunks, usage, ids and errors moved to bodies.py.
"""
from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator

from ..errors import RequestError

MAX_TOKENS_CAP = 1 << 20          # "absurd" beyond this, whatever the model
INT64 = (-(1 << 63), (1 << 64) - 1)
MAX_N = 16                        # choices per request (each decodes in its own forked session)
MAX_TOP_LOGPROBS = 20
MAX_STOP_IDS = 64
MAX_TOOLS = 128


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


class TextPart(_Strict):
    type: Literal["text"]
    text: StrictStr


class FunctionCall(_Strict):
    name: Annotated[StrictStr, Field(min_length=1, max_length=64)]
    arguments: StrictStr


class ToolCall(_Strict):
    id: Annotated[StrictStr, Field(max_length=256)]
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[StrictStr, list[TextPart], None] = None
    name: StrictStr | None = None
    tool_call_id: StrictStr | None = None
    tool_calls: Annotated[list[ToolCall], Field(max_length=MAX_TOOLS)] | None = None
    refusal: StrictStr | None = None

    @model_validator(mode="after")
    def _content(self):
        if self.tool_calls and self.role != "assistant":
            raise ValueError(f"only assistant messages carry tool_calls, not {self.role}")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id")
        if self.content is None and not self.tool_calls:
            raise ValueError(f"a {self.role} message needs content")
        return self

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content or [])

    def plain(self) -> dict:
        """The message the context policy and the chat template see (tools.py renders
        tool calls and tool results)."""
        role = "system" if self.role == "developer" else self.role
        return {"role": role, "content": self.text()}


class JsonSchemaFormat(_Strict):
    name: Annotated[StrictStr, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    description: StrictStr | None = None
    schema_: dict | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema(self):
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema is required with type json_schema, and only then")
        return self


class StructuredOutputs(_Strict):
    """Extension (vLLM's name): exactly one constraint of the output."""
    json_: Union[dict, StrictStr, None] = Field(default=None, alias="json")
    regex: StrictStr | None = None
    choice: Annotated[list[Annotated[StrictStr, Field(min_length=1)]], Field(min_length=1,
                                                                             max_length=1024)] | None = None
    grammar: StrictStr | None = None
    json_object: bool | None = None

    @model_validator(mode="after")
    def _one(self):
        given = [k for k in ("json_", "regex", "choice", "grammar") if getattr(self, k) is not None]
        given += ["json_object"] if self.json_object else []
        if len(given) != 1:
            raise ValueError("structured_outputs takes exactly one of json, regex, choice, grammar, "
                             f"json_object; got {len(given)}")
        return self


class FunctionDef(_Strict):
    name: Annotated[StrictStr, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]
    description: StrictStr | None = None
    parameters: dict | None = None
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Strict):
    name: StrictStr


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class StreamOptions(_Strict):
    include_usage: bool = False
    include_obfuscation: bool | None = None


Stop = Union[StrictStr, Annotated[list[Annotated[StrictStr, Field(min_length=1, max_length=512)]],
                                  Field(max_length=4)], None]


class _Sampling(_Strict):
    model: Annotated[StrictStr, Field(min_length=1, max_length=256)]
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[StrictInt, Field(ge=0, le=1 << 20)] | None = None     # extension
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None           # extension
    repetition_penalty: Annotated[float, Field(gt=0.0, le=10.0)] | None = None   # extension
    stop_token_ids: Annotated[list[Annotated[StrictInt, Field(ge=0)]],
                              Field(max_length=MAX_STOP_IDS)] | None = None   # extension
    structured_outputs: StructuredOutputs | None = None                  # extension
    ignore_eos: StrictBool = False          # extension (vLLM's): end-of-sequence ids do not end it
    min_tokens: Annotated[StrictInt, Field(ge=0, le=MAX_TOKENS_CAP)] = 0   # extension (vLLM's)
    seed: Annotated[StrictInt, Field(ge=INT64[0], le=INT64[1])] | None = None
    stop: Stop = None
    n: Annotated[StrictInt, Field(ge=1, le=MAX_N)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: StrictStr | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    logit_bias: Annotated[dict[StrictStr, Union[StrictInt, float]], Field(max_length=1024)] | None = None
    response_format: ResponseFormat | None = None
    metadata: dict | None = None
    store: bool | None = None
    service_tier: StrictStr | None = None

    @model_validator(mode="after")
    def _supported(self):
        if isinstance(self.stop, str) and not self.stop:
            raise ValueError("stop must be a non-empty string or a list of them")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        if self.structured_outputs is not None and self.response_format is not None \
                and self.response_format.type != "text":
            raise ValueError("send response_format or structured_outputs, not both")
        return self

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_Sampling):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Annotated[StrictInt, Field(ge=1, le=MAX_TOKENS_CAP)] | None = None
    max_completion_tokens: Annotated[StrictInt, Field(ge=1, le=MAX_TOKENS_CAP)] | None = None
    logprobs: bool | None = None
    top_logprobs: StrictInt | None = None
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Union[Literal["none", "auto", "required"], NamedToolChoice, None] = None
    parallel_tool_calls: bool | None = None
    modalities: list[StrictStr] | None = None
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = None   # a template variable

    @model_validator(mode="after")
    def _chat_supported(self):
        if self.top_logprobs is not None:
            if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
                raise ValueError(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], "
                                 f"got {self.top_logprobs}")
            if not self.logprobs:
                raise ValueError("top_logprobs needs logprobs: true")
        if self.tool_choice not in (None, "none", "auto") and not self.tools:
            raise ValueError("tool_choice other than none/auto needs tools")
        if self.modalities and self.modalities != ["text"]:
            raise ValueError("only the text modality is supported")
        if self.max_tokens is not None and self.max_completion_tokens is not None \
                and self.max_tokens != self.max_completion_tokens:
            raise ValueError("max_tokens and max_completion_tokens disagree; send one")
        return self

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def template_variables(self) -> dict | None:
        """Chat-template variables the request sets (gpt-oss's template reads reasoning_effort;
        a template that does not mention one ignores it)."""
        return {"reasoning_effort": self.reasoning_effort} if self.reasoning_effort else None

    def plain_messages(self) -> list[dict]:
        return [m.plain() for m in self.messages]


TokenIds = Annotated[list[Annotated[StrictInt, Field(ge=0)]], Field(min_length=1)]



class TokenizeRequest(_Strict):
    """POST /tokenize (vLLM's and llama.cpp's): a prompt or chat messages -> their ids."""
    model: Annotated[StrictStr, Field(min_length=1, max_length=256)] | None = None
    prompt: StrictStr | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    add_generation_prompt: StrictBool = True        # messages: as the chat endpoint renders them
    add_special_tokens: StrictBool = True           # prompt: the BOS the completions endpoint adds
    return_token_strs: StrictBool = False

    @model_validator(mode="after")
    def _one_input(self):
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("send exactly one of prompt and messages")
        return self


class DetokenizeRequest(_Strict):
    """POST /detokenize: ids -> their text (special tokens kept, as the completions echo)."""
    model: Annotated[StrictStr, Field(min_length=1, max_length=256)] | None = None
    tokens: Annotated[list[Annotated[StrictInt, Field(ge=0)]], Field(max_length=1 << 20)]

class CompletionRequest(_Sampling):
    prompt: Union[StrictStr, TokenIds, Annotated[list[StrictStr], Field(min_length=1, max_length=1)],
                  Annotated[list[TokenIds], Field(min_length=1, max_length=1)]]
    max_tokens: Annotated[StrictInt, Field(ge=0, le=MAX_TOKENS_CAP)] | None = 16
    echo: bool = False
    suffix: StrictStr | None = None
    best_of: StrictInt | None = None
    logprobs: StrictInt | None = None

    @model_validator(mode="after")
    def _completion_supported(self):
        if self.suffix:
            raise ValueError("suffix (insertion) is not supported")
        if self.best_of not in (None, 1):
            raise ValueError("best_of must be 1 on this server (use n for several choices)")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {self.logprobs}")
        if isinstance(self.prompt, str) and not self.prompt:
            raise ValueError("prompt must not be empty")
        return self

    def single_prompt(self) -> str | list[int]:
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            p = p[0]
        if isinstance(p, str) and not p:
            raise RequestError("prompt must not be empty")
        return p
