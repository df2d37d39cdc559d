"""The generation loop: prompt -> token ids -> text, with stop strings.

Owns: `generate_ids` (prefill, then decode or speculate until EOS /
max_tokens), `generate_many` (several prompts decoded together, each answer
what `generate_ids` gives it alone) and `stream_text` (incremental
detokenisation that never emits a stop string or half a UTF-8 character).
Does not own: sampling rules (sampling.py), drafting (speculative.py) or the
batched greedy loop (backends/greedy.py, pipelined on CUDA).
"""
from __future__ import annotations

from typing import Iterable, Iterator

from ..errors import ModelError
from ..backends.greedy import greedy_rows
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
    steps = engine.stream_steps() if picker.greedy_only and max_tokens > 1 else None
    for i in range(max_tokens):
        tok = picker.pick(logits).token
        if tok in eos:
            return
        yield tok
        if picker.stopped:
            return
        if steps is not None:                 # the rest one step ahead (CUDA: MUSER_PIPELINE)
            yield from greedy_ahead(session, tok, max_tokens, eos, steps)
            return
        if i + 1 < max_tokens:
            logits = session.decode(tok)


def greedy_ahead(session, first: int, max_tokens: int, eos, steps) -> Iterator[int]:
    """Greedy tokens after `first` (already yielded, token 1 of max_tokens), each step launched
    before the last one's pick is read (backends/greedy.py's steps).  The session ends holding
    what the step-by-step loop leaves: a step taken past an end of sequence, past max_tokens or
    past the token the caller stopped at is taken back.  A step with no finite logit raises
    ModelError (the step-by-step loop would take argmax of NaN)."""
    from ..backends.greedy import FromLast
    ahead = steps.launch([session], [first])             # consumes token 1, picks token 2
    made = 1
    try:
        while True:
            behind = ahead
            # the pick of `behind` is token made + 1; the step after it only if one more is due
            ahead = steps.launch([session], [FromLast(0)]) if made + 1 < max_tokens else None
            best, ok = steps.collect(behind)
            if not ok[0]:
                raise ModelError("the model produced no finite logit for the next token")
            if best[0] in eos:
                return
            made += 1
            yield best[0]
            if ahead is None:
                return
    finally:
        if ahead is not None:                            # a step past what the caller took
            steps.take_back(session)


def generate_many(engine, prompts: list[list[int]], max_tokens: int,
                  params: list[SamplingParams]) -> list[list[int]]:
    """Each prompt's generated ids (`generate_ids` without speculation or a grammar), every
    prompt's decode steps batched together: greedy prompts through `Engine.decode_greedy`,
    sampled ones a batched step a token, each with its own seeded picker.  The same steps as
    `generate_ids` per prompt, so the same tokens wherever a batched row is the row alone."""
    eos = tuple(engine.spec.eos_token_ids)
    out: list[list[int]] = [[] for _ in prompts]
    if max_tokens == 0:
        return out
    greedy = [i for i, p in enumerate(params) if p.greedy]
    sampled = [i for i, p in enumerate(params) if not p.greedy]
    if greedy:
        # as generate_ids: the first token from the prompt's prefill, the rest decoded together
        sessions, first = [], []
        for i in greedy:
            s = engine.new_session()
            best, ok = greedy_rows(s.prefill(prompts[i])[None])
            if not bool(ok[0]):
                raise ModelError(f"prompt {i}: the model produced no finite logit for its next "
                                 "token (NaN or -inf everywhere)")
            if int(best[0]) in eos:
                continue
            out[i].append(int(best[0]))
            sessions.append(s)
            first.append(i)
        run = engine.decode_greedy(sessions, [out[i][0] for i in first], max_tokens - 1, eos)
        for i, toks, why in zip(first, run.tokens, run.finish):
            if why == "nonfinite":
                raise ModelError(f"prompt {i}: the model produced no finite logit for its next "
                                 "token (NaN or -inf everywhere)")
            out[i] += toks
    if sampled:
        pickers = {i: TokenPicker(params[i]) for i in sampled}
        sessions = {i: engine.new_session() for i in sampled}
        logits = {i: sessions[i].prefill(prompts[i]) for i in sampled}
        live = list(sampled)
        while live:
            nxt = []
            for i in live:
                tok = pickers[i].pick(logits[i]).token
                if tok in eos:
                    continue
                out[i].append(tok)
                if len(out[i]) < max_tokens:
                    nxt.append(i)
            if nxt:
                rows = engine.decode_batch([sessions[i] for i in nxt], [out[i][-1] for i in nxt])
                logits = {i: rows[j] for j, i in enumerate(nxt)}
            live = nxt
    return out


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
