"""The generation loop: prompt -> token ids -> text, with stop strings.

Owns: `generate_ids` (prefill, then decode or speculate until EOS /
max_tokens) and `stream_text` (incremental detokenisation that never emits
a stop string or half a UTF-8 character).  Does not own: sampling rules
(sampling.py) or drafting (speculative.py).
"""
from __future__ import annotations

from typing import Iterable, Iterator

from .picker import TokenPicker
from .sampling import SamplingParams


def generate_ids(engine, session, ids: list[int], max_tokens: int, params: SamplingParams,
                 speculative=None, block: int | None = None,
                 stats: dict | None = None, picker: TokenPicker | None = None) -> Iterator[int]:
    """Token ids after `ids`, until end-of-sequence, `max_tokens`, or a grammar that is
    complete (`picker.stopped`).  `picker` carries controls, a grammar and logprobs;
    without one, tokens are sampled from the raw logits."""
    picker = picker if picker is not None else TokenPicker(params)
    if speculative:
        from .speculative import speculative_generate
        yield from speculative_generate(engine, session, ids, max_tokens, params, speculative,
                                        block, stats, picker=picker)
        return
    if max_tokens == 0:
        return
    eos = set(engine.spec.eos_token_ids) | picker.end_ids
    logits = session.prefill(ids)
    for i in range(max_tokens):
        tok = picker.pick(logits).token
        if tok in eos:
            return
        yield tok
        if picker.stopped:
            return
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
