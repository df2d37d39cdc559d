"""Text in and out of the tokenizer: a shared proxy, size bounds, chat readiness, stop-aware deltas.

Owns: `SharedTokenizer` (the one tokenizer every thread uses, without a
lock: see its docstring), `chars_per_token_bound` (how many input characters
one token can cover at most, so a prompt's size alone can prove it too long
before it is tokenized), `base_model_note` (whether a model looks like a base,
not instruction-tuned, model and what to say about it), `turn_marker_ids`
(the chat template's turn tokens, stop tokens for a chat), and `TextStream`
(incremental detokenisation that never emits a stop string or half a UTF-8
character).  Does not own: the tokenizer itself (muser.model.tokenizer) or
when generation stops (scheduler.py).
"""
from __future__ import annotations

import json
import math

TURN_MARKERS = ("<start_of_turn>", "<end_of_turn>")


class SharedTokenizer:
    """The shared fast tokenizer, called from request threads and the worker at once.

    No lock: a long prompt being tokenized in a request thread must never hold
    up the worker, which decodes every running stream's next token.  This is
    safe because the Rust tokenizer's encode and decode only take shared
    borrows once its truncation / padding settings are settled -- the first
    call may change them (a mutable borrow), so `__init__` makes that call
    before any other thread exists -- and encode releases the GIL, so a
    multi-megabyte prompt does not stall the event loop or the worker either.
    """

    def __init__(self, tokenizer):
        self._tok = tokenizer
        self.eos_token_ids = tuple(tokenizer.eos_token_ids)
        tokenizer.encode("warm up", add_bos=True)          # settle settings: shared borrows after
        tokenizer.decode([0])

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        return list(self._tok.encode(text, add_bos=add_bos))

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self._tok.decode(ids, skip_special_tokens)

    def token_id(self, token: str) -> int | None:
        return self._tok.token_id(token)

    def apply_chat_template(self, messages, add_generation_prompt: bool = True,
                            variables: dict | None = None) -> list[int]:
        return list(self._tok.apply_chat_template(messages, add_generation_prompt, variables))

    def render_chat(self, messages, add_generation_prompt: bool = True, variables: dict | None = None) -> str:
        return self._tok.render_chat(messages, add_generation_prompt, variables)


# Normalizers that never shrink the text: each input character stays one or more characters.
_GROWING_NORMALIZERS = {"Prepend", "Replace"}


def chars_per_token_bound(tokenizer) -> int | None:
    """At most how many input characters one token covers; None when no bound is certain.

    The bound is the longest vocabulary entry, which holds only when the
    tokenizer's normalizer cannot shrink the input (none, or single-character
    replacements and prepends: Gemma's replaces " " by "\u2581").  A normalizer that
    strips or composes characters can map many input characters to one, so
    then there is no bound and prompts are always tokenized to be measured.
    """
    hf = getattr(tokenizer, "hf", None)
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is None:
        return None
    norm = backend.normalizer
    if norm is not None:
        try:
            state = json.loads(norm.__getstate__())
        except Exception:                      # noqa: BLE001 -- unknown shape: no bound
            return None
        parts = state.get("normalizers", [state]) if state.get("type") == "Sequence" else [state]
        for part in parts:
            if part.get("type") not in _GROWING_NORMALIZERS:
                return None
            if part.get("type") == "Replace":
                pattern = part.get("pattern", {}).get("String")
                if pattern is None or len(pattern) != 1 or not part.get("content"):
                    return None
    try:
        longest = max(len(piece) for piece in hf.get_vocab())
    except Exception:                          # noqa: BLE001
        return None
    return max(1, longest)


def min_tokens(chars: int, bound: int | None) -> int:
    """Fewest tokens `chars` input characters can encode to (0 when unbounded)."""
    return math.ceil(chars / bound) if bound else 0


def turn_marker_ids(tokenizer) -> tuple[int, ...]:
    """Ids of the turn markers the chat template writes (stop tokens for a chat reply)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    ids = []
    for marker in TURN_MARKERS:
        if marker in template:
            i = tokenizer.token_id(marker)
            if i is not None:
                ids.append(int(i))
    return tuple(ids)


def base_model_note(engine) -> str | None:
    """A plain sentence when the model looks like a base (not instruction-tuned) model.

    The signal: the model file carries no chat template of its own, so muser
    falls back to the family's template (Gemma's) -- instruction-tuned GGUFs
    ship theirs.  A base model continues text; in a chat it tends to loop or
    write both sides of the conversation.
    """
    if not getattr(engine, "has_tokenizer", True):
        return None
    tok = engine.tokenizer
    own = getattr(getattr(tok, "hf", None), "chat_template", None)
    if own or not getattr(tok, "chat_template", None):
        return None
    return (f"model {engine.name!r} carries no chat template of its own: it looks like a base "
            "(not instruction-tuned) model, so chat replies may ramble or repeat; replies stop "
            "at the turn markers. For plain continuation use `muser generate`; for chat, load an "
            "instruction-tuned GGUF (e.g. --model gemma-3-270m-it-Q8_0.gguf).")


class TextStream:
    """Text deltas of a generation that never emit a stop string or half a character."""

    def __init__(self, tokenizer, stops: list[str]):
        from ..model.tokenizer import StreamDecoder
        self.decoder = StreamDecoder(tokenizer)
        self.stops = [s for s in stops if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.pending = ""

    def push(self, token: int) -> tuple[str, bool]:
        """(text safe to emit, whether a stop string ended the generation)."""
        self.pending += self.decoder.push(token)
        for s in self.stops:
            at = self.pending.find(s)
            if at >= 0:
                out, self.pending = self.pending[:at], ""
                return out, True
        if len(self.pending) > self.hold:
            cut = len(self.pending) - self.hold
            out, self.pending = self.pending[:cut], self.pending[cut:]
            return out, False
        return "", False

    def flush(self) -> str:
        out, self.pending = self.pending + self.decoder.flush(), ""
        return out

    def take_reasoning(self) -> str:
        """Plain text has no reasoning channel (channels.ChannelText has)."""
        return ""
