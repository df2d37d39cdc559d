"""Logprobs in OpenAI's two shapes, from the picks the scheduler sends.

Owns: `TokenText` (a token id's text and exact bytes, from the grammar engine's
tokenizer, cached) and the two wire shapes: chat (`{"content": [{"token", "logprob",
"bytes", "top_logprobs"}]}`) and legacy completions (`{"tokens", "token_logprobs",
"top_logprobs", "text_offset"}`, where a prompt's first token has no logprob: null).
Does not own: computing logprobs (engine/picker.py, server/choices.py).
"""
from __future__ import annotations

import functools


class TokenText:
    def __init__(self, engine):
        self._tok = engine.grammars.tokenizer        # llguidance: exact bytes per token

    @functools.lru_cache(maxsize=65536)
    def bytes(self, token: int) -> bytes:
        return self._tok.decode_bytes([int(token)])

    def text(self, token: int) -> str:
        return self.bytes(token).decode("utf-8", errors="backslashreplace")


def chat_entries(tt: TokenText, picks) -> list[dict]:
    out = []
    for p in picks:
        out.append({"token": tt.text(p.token), "logprob": p.logprob,
                    "bytes": list(tt.bytes(p.token)),
                    "top_logprobs": [{"token": tt.text(t), "logprob": lp, "bytes": list(tt.bytes(t))}
                                     for t, lp in (p.top or ())]})
    return out


def completion_logprobs(tt: TokenText, picks, offset: int = 0) -> dict:
    """`offset`: characters of text before the first pick (text_offset counts from there)."""
    tokens, lps, tops, offs = [], [], [], []
    for p in picks:
        s = tt.text(p.token)
        tokens.append(s)
        lps.append(p.logprob)
        tops.append(None if p.top is None else {tt.text(t): lp for t, lp in p.top})
        offs.append(offset)
        offset += len(s)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offs}
