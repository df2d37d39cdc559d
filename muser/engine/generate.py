"""The generation loop: prompt -> token ids -> text, with stop strings.

Owns: `generate_ids` (prefill, then decode or speculate until EOS /
max_tokens) and `stream_text` (incremental detokenisation that never emits
a stop string or half a UTF-8 character).  Does not own: sampling rules
(sampling.py) or drafting (speculative.py).
"""
from __future__ import annotations

from typing import Iterable, Iterator

from .sampling import SamplingParams, sample


def generate_ids(engine, session, ids: list[int], max_tokens: int, params: SamplingParams,
                 speculative=None, block: int | None = None,
                 stats: dict | None = None) -> Iterator[int]:
    if speculative:
        from .speculative import speculative_generate
        yield from speculative_generate(engine, session, ids, max_tokens, params, speculative,
                                        block, stats)
        return
    if max_tokens == 0:
        return
    eos = set(engine.spec.eos_token_ids)
    gen = params.generator()
    logits = session.prefill(ids)
    for i in range(max_tokens):
        tok = sample(logits, params, gen)
        if tok in eos:
            return
        yield tok
        if i + 1 < max_tokens:
            logits = session.decode(tok)


def stream_text(engine, token_ids: Iterable[int], stop: Iterable[str] | str | None = None) -> Iterator[str]:
    """Yield text deltas; hold back just enough text to never emit a stop string."""
    from ..model.tokenizer import StreamDecoder
    stops = [stop] if isinstance(stop, str) else [s for s in (stop or []) if s]
    hold = max((len(s) for s in stops), default=1) - 1
    decoder = StreamDecoder(engine.tokenizer)
    pending = ""
    for tok in token_ids:
        pending += decoder.push(tok)
        for s in stops:
            at = pending.find(s)
            if at >= 0:
                if at:
                    yield pending[:at]
                return
        if len(pending) > hold:
            cut = len(pending) - hold
            yield pending[:cut]
            pending = pending[cut:]
    pending += decoder.flush()
    for s in stops:
        at = pending.find(s)
        if at >= 0:
            pending = pending[:at]
    if pending:
        yield pending
