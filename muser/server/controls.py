"""A request's decoding controls: its fields -> a `Decoding` checked against this model.

Owns: `DecodingControls`, the part of `ServerState` (service.py) that turns a validated
request into what the token choice needs -- sampling parameters, stop token ids (the
turn markers of a free chat), min_tokens and its enders, penalties and logit bias
(`Controls`), logprobs, and the grammar from tool_choice / response_format /
structured_outputs, compiled once to check it (ParameterError -> 400 naming the field).
A mixin: the host provides `engine`, `turn_markers`, `eos_ids` and
`tokenizer_speaks_harmony`.
Does not own: validation (schemas.py), the `Decoding` it returns (choices.py), the
request-safe sampling floors (sampler.py), tool schemas and their grammar (tools.py),
applying the controls to logits (engine/logits_processors.py), the gates and serving
(service.py).
"""
from __future__ import annotations

import json

from ..engine.constrained import Grammar
from ..engine.logits_processors import Controls
from ..engine.sampling import SamplingParams
from ..errors import ParameterError
from .choices import Decoding
from .sampler import sampling_params
from . import tools as toolkit


class DecodingControls:
    def sampling(self, req) -> SamplingParams:
        return sampling_params(req.temperature, req.top_p, req.top_k, req.seed)

    def decoding(self, req, chat: bool, tools=None) -> Decoding:
        """Everything the request asks of the token choice, checked against this model
        (vocabulary, grammar compilation): ParameterError -> 400 naming the field."""
        vocab = self.engine.spec.vocab_size
        stop_ids = frozenset(req.stop_token_ids or ())
        bad = sorted(t for t in stop_ids if t >= vocab)
        if bad:
            raise ParameterError("stop_token_ids", f"token ids must be in [0, {vocab}), got {bad[:5]}")
        if chat:
            logprobs = (req.top_logprobs or 0) if req.logprobs else None
        else:
            logprobs = req.logprobs
        grammar = self.grammar(req, tools)
        if grammar is not None:
            self.engine.grammars.check(grammar)
        elif chat and not req.ignore_eos:   # a (base) model's free chat stops at the turn
            stop_ids = stop_ids | self.turn_markers   # markers; a grammar decides itself
        limit = req.token_limit if chat else req.max_tokens
        if limit is not None and req.min_tokens > limit:
            raise ParameterError("min_tokens", f"must be at most max_tokens ({limit}), got "
                                               f"{req.min_tokens}")
        # min_tokens refuses every id that would end the output before it has that many
        enders = tuple(sorted(stop_ids | self.eos_ids)) if req.min_tokens else ()
        controls = Controls(req.frequency_penalty or 0.0, req.presence_penalty or 0.0,
                            1.0 if req.repetition_penalty is None else req.repetition_penalty,
                            Controls.bias_from(req.logit_bias, vocab), req.min_p or 0.0,
                            req.min_tokens, enders)
        return Decoding(self.sampling(req), controls, grammar, logprobs, req.n, stop_ids,
                        prompt_logprobs=not chat and req.echo and req.logprobs is not None,
                        channels=chat and grammar is None and self.tokenizer_speaks_harmony,
                        tool_calls=tools is not None and tools.active, ignore_eos=req.ignore_eos)

    def grammar(self, req, tools) -> Grammar | None:
        rf, so = req.response_format, req.structured_outputs
        if tools is not None and tools.constrained:
            if (rf is not None and rf.type != "text") or so is not None:
                raise ParameterError("tool_choice", "a required or named tool choice cannot be "
                                     "combined with response_format or structured_outputs")
            toolkit.check_schemas(tools, self.engine.grammars)
            return toolkit.grammar(tools)
        if rf is not None and rf.type == "json_object":
            return Grammar("json_object", "", "response_format")
        if rf is not None and rf.type == "json_schema":
            if rf.json_schema.schema_ is None:
                raise ParameterError("response_format.json_schema.schema", "a schema is required")
            return Grammar.json_schema(rf.json_schema.schema_)
        if so is None:
            return None
        if so.json_ is not None:
            schema = so.json_
            if isinstance(schema, str):
                try:
                    schema = json.loads(schema)
                except ValueError as e:
                    raise ParameterError("structured_outputs.json", f"not valid JSON: {e}") from None
            return Grammar.json_schema(schema, "structured_outputs.json")
        if so.regex is not None:
            return Grammar("regex", so.regex, "structured_outputs.regex")
        if so.choice is not None:
            return Grammar("choice", json.dumps(so.choice), "structured_outputs.choice")
        if so.grammar is not None:
            return Grammar("lark", so.grammar, "structured_outputs.grammar")
        return Grammar("json_object", "", "structured_outputs.json_object")
