"""Text <-> token ids, chat templates, and streaming-safe detokenization.

Owns: building a tokenizer from a GGUF (transformers' own GGUF tokenizer
conversion -- no hand-written BPE, so ids equal transformers' and llama.cpp's)
or from a HF directory (tokenizer.json / tokenizer_config.json, offline); the
chat template (the model's own, or Gemma's shipped here for template-less Gemma
GGUFs); end-of-turn ids; `StreamDecoder`; `require_tokenizer`.
Does not own: sampling, stop strings, or when to stop (muser.engine).

Loading is cached per (path, modification time, size): the first build of the
270M GGUF's 262,144-token vocabulary takes seconds, later ones are free.
"""
from __future__ import annotations

import functools
import warnings
from pathlib import Path

from muser.errors import ModelFormatError, RequestError, TokenizerUnavailable

# Gemma 3's chat template (text only): a system message is folded into the first
# user turn, "assistant" is spelled "model", every turn ends with <end_of_turn>.
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)
# tokens that end a turn in some chat template; one is an end-of-sequence id when the template uses it
_END_OF_TURN = ("<end_of_turn>", "<|im_end|>", "<|eot_id|>", "<|END_OF_TURN_TOKEN|>", "<|end|>")
# Harmony (gpt-oss): every message ends with <|end|>, but generation ends only with <|return|>
# (the final answer) or <|call|> (a tool call) -- after an analysis message ends with <|end|> the
# model goes on with <|start|>assistant<|channel|>final...  So with a harmony template <|end|>
# must NOT stop generation, and these two must.
_HARMONY_STOPS = ("<|return|>", "<|call|>")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model")


class Tokenizer:
    """A thin, explicit wrapper over a transformers fast tokenizer."""

    def __init__(self, hf, chat_template: str | None = None, extra_eos: tuple[int, ...] = (), source: str = ""):
        self.hf = hf
        # A fast tokenizer decodes through its Rust `tokenizers.Tokenizer` directly: what
        # transformers' decode does with clean-up off (it calls the same method), without its
        # Python layers -- 2.6 against 6.8 us a call on Gemma 3, and a streamed token costs two
        # calls on the server's worker thread (StreamDecoder), which shares the GIL with the
        # HTTP loop.  tests/model/test_tokenizer.py pins the equality.
        rust = getattr(hf, "backend_tokenizer", None)
        self._rust = rust if callable(getattr(rust, "decode", None)) else None
        self.source = source
        self.chat_template = chat_template or getattr(hf, "chat_template", None)
        vocab = hf.get_vocab()
        eos = [hf.eos_token_id] if hf.eos_token_id is not None else []
        eos += list(extra_eos)
        self.harmony = bool(self.chat_template) and "<|channel|>" in self.chat_template
        for tok in _END_OF_TURN:
            if self.harmony and tok == "<|end|>":
                continue
            if tok in vocab and self.chat_template and tok in self.chat_template:
                eos.append(vocab[tok])
        if self.harmony:
            eos += [vocab[tok] for tok in _HARMONY_STOPS if tok in vocab]
            end = vocab.get("<|end|>")
            eos = [i for i in eos if i != end]
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(int(i) for i in eos))
        self.bos_token_id: int | None = hf.bos_token_id
        self.vocab_size: int = len(hf)

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        """Token ids of `text`; `add_bos` adds the tokenizer's special prefix (BOS) if it has one."""
        return list(self.hf.encode(text, add_special_tokens=add_bos))

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        if self._rust is not None:
            return self._rust.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens,
                              clean_up_tokenization_spaces=False)

    def token_id(self, token: str) -> int | None:
        """The id of one vocabulary entry, None when there is none (no dict of the whole
        vocabulary is built: 262k entries on Gemma)."""
        i = self.hf.convert_tokens_to_ids(token)
        if i is None or (i == self.hf.unk_token_id and token != self.hf.unk_token):
            return None
        return int(i)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True,
                    variables: dict | None = None) -> str:
        """The chat template's text for `messages` ([{"role": ..., "content": str}, ...]);
        `variables`: extra template variables (e.g. gpt-oss's `reasoning_effort`)."""
        if not self.chat_template:
            raise ModelFormatError(f"tokenizer from {self.source or 'memory'} has no chat template")
        try:
            return self.hf.apply_chat_template(messages, chat_template=self.chat_template, tokenize=False,
                                               add_generation_prompt=add_generation_prompt,
                                               **(variables or {}))
        except Exception as e:      # jinja's TemplateError from raise_exception, bad message shapes
            if type(e).__name__ in ("TemplateError", "TemplateSyntaxError", "KeyError", "TypeError"):
                raise RequestError(f"chat messages rejected by the template: {e}") from e
            raise

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            variables: dict | None = None) -> list[int]:
        """Token ids of the rendered chat.  The template writes BOS itself, so none is added
        (as transformers' `apply_chat_template(tokenize=True)` does)."""
        return self.encode(self.render_chat(messages, add_generation_prompt, variables), add_bos=False)


class StreamDecoder:
    """Turns ids arriving one at a time into text deltas, never splitting a UTF-8 character.

    Decodes a short window of recent ids twice (with and without the newest) and
    emits the difference once it no longer ends in U+FFFD (an incomplete byte
    sequence).  The deltas concatenate to `decode(all ids)`.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False):
        self.tok = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self._prefix = 0        # start of the window re-decoded for context (spaces, merges)
        self._read = 0          # ids before this have been emitted

    def _texts(self) -> tuple[str, str]:
        d = self.tok.decode
        return (d(self.ids[self._prefix:self._read], self.skip), d(self.ids[self._prefix:], self.skip))

    def push(self, token_id: int) -> str:
        self.ids.append(int(token_id))
        old, new = self._texts()
        if len(new) > len(old) and not new.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self.ids)
            return new[len(old):]
        return ""

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character decodes to U+FFFD)."""
        old, new = self._texts()
        self._prefix = self._read = len(self.ids)
        return new[len(old):] if len(new) > len(old) else ""

    def __call__(self, token_id: int) -> str:
        return self.push(token_id)


def require_tokenizer(tokenizer: Tokenizer | None, what: str = "this model") -> Tokenizer:
    """The tokenizer, or `TokenizerUnavailable` for a model loaded without tokenizer files."""
    if tokenizer is None:
        raise TokenizerUnavailable(f"{what} was loaded without tokenizer files; pass token ids, "
                                   "or add tokenizer.json / tokenizer_config.json to the model directory")
    return tokenizer


# ----------------------------------------------------------------------------- loading
def load_tokenizer(path) -> Tokenizer | None:
    """A `Tokenizer` for a .gguf file or a HF directory; None when the directory has no
    tokenizer files.  Cached per (path, mtime, size)."""
    p = Path(path).resolve()
    if p.is_dir():
        if not any((p / f).exists() for f in _TOKENIZER_FILES):
            return None
        # the template and end-of-turn ids also depend on the configs
        files = [f for f in p.iterdir() if f.name.startswith(("tokenizer", "special_tokens", "chat_template"))
                 or f.name in ("vocab.json", "merges.txt", "spiece.model", "config.json", "generation_config.json")]
        key = tuple((f.name, f.stat().st_mtime_ns, f.stat().st_size) for f in files)
    else:
        st = p.stat()
        key = (st.st_mtime_ns, st.st_size)
    return _load_cached(str(p), key)


@functools.lru_cache(maxsize=8)
def _load_cached(path: str, _key) -> Tokenizer | None:
    p = Path(path)
    if p.is_dir():
        return _from_hf_dir(p)
    if p.suffix != ".gguf":
        raise ModelFormatError(f"{p}: expected a .gguf file or a model directory")
    try:
        return _from_gguf(p)
    except Exception as e:              # noqa: BLE001 -- transformers cannot read this vocabulary
        # (no tokenizer metadata, or a tokenizer model it does not know, e.g. Gemma 4's "gemma4")
        why = f"{type(e).__name__}: {e}"[:200]
    if any((p.parent / f).exists() for f in _TOKENIZER_FILES):
        warnings.warn(f"muser: the tokenizer in {p.name} could not be read ({why}); using the "
                      f"tokenizer files beside it in {p.parent}")
        return _from_hf_dir(p.parent)
    warnings.warn(f"muser: no tokenizer could be read from {p.name} ({why}); the model is loaded "
                  "without one (pass token ids, or put the model's tokenizer.json beside the file)")
    return None


def _from_gguf(p: Path) -> Tokenizer:
    from muser.model.gguf_file import GGUFFile
    from muser.model.spec import GEMMA3_END_OF_TURN
    arch = GGUFFile(p).fields.get("general.architecture", "")
    import transformers
    if arch.startswith("gemma"):
        # The Gemma class directly: AutoTokenizer would first parse the whole GGUF for a config (~15 s).
        hf = transformers.GemmaTokenizer.from_pretrained(str(p.parent), gguf_file=p.name, local_files_only=True)
    else:
        hf = transformers.AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name, local_files_only=True)
    template = getattr(hf, "chat_template", None)
    if not template and arch.startswith("gemma"):
        template = GEMMA_CHAT_TEMPLATE          # the GGUF carries none
    extra = (GEMMA3_END_OF_TURN,) if arch == "gemma3" and len(hf) > GEMMA3_END_OF_TURN else ()
    return Tokenizer(hf, template, extra_eos=extra, source=str(p))


def _from_hf_dir(p: Path) -> Tokenizer:
    import json
    import transformers
    try:
        hf = transformers.AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    except Exception as e:
        raise ModelFormatError(f"{p}: tokenizer files present but unreadable: {e}") from e
    template = getattr(hf, "chat_template", None)
    extra: tuple[int, ...] = ()
    try:
        cfg = json.loads((p / "config.json").read_text())
        gen = json.loads((p / "generation_config.json").read_text()) if (p / "generation_config.json").exists() else {}
    except (OSError, json.JSONDecodeError):
        cfg, gen = {}, {}
    if not template and str(cfg.get("model_type", "")).startswith("gemma"):
        template = GEMMA_CHAT_TEMPLATE
    eos = gen.get("eos_token_id")
    if eos is not None:
        extra = tuple(eos if isinstance(eos, list) else [eos])
    return Tokenizer(hf, template, extra_eos=extra, source=str(p))
