"""Text in and out of the shared tokenizer: a locked proxy and stop-aware deltas.

Owns: `LockedTokenizer` (every call into the fast tokenizer under one lock)
and `TextStream` (incremental detokenisation that never emits a stop string
or half a UTF-8 character).  Does not own: the tokenizer itself
(muser.model.tokenizer) or when generation stops (scheduler.py).
"""
from __future__ import annotations

import threading


class LockedTokenizer:
    """One lock around every call into the shared fast tokenizer.

    A Rust-backed fast tokenizer refuses a mutable borrow while another thread
    holds one ("Already borrowed"): planning encodes in worker threads while the
    scheduler decodes, so every call goes through this lock.
    """

    def __init__(self, tokenizer):
        self._tok = tokenizer
        self._lock = threading.Lock()
        self.eos_token_ids = tuple(tokenizer.eos_token_ids)

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        with self._lock:
            return list(self._tok.encode(text, add_bos=add_bos))

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        with self._lock:
            return self._tok.decode(ids, skip_special_tokens)

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> list[int]:
        with self._lock:
            return list(self._tok.apply_chat_template(messages, add_generation_prompt))


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
