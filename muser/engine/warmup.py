"""Warming a captured-step backend up before the first request: every decode batch size once.

Owns: `warm_up(engine, sessions, steps)` -- on a backend with a decode runner (CUDA graphs),
prefill each given (empty) session with a short prompt, run the decode steps the caller will
run for every batch size 1..len(sessions) -- greedy steps one ahead (`steps`, the server's
pipelined rounds) or `decode_batch` -- then reset the sessions.  Does not own: when to warm up
(the server at start: `muser serve --no-warmup` skips it), the steps themselves, the graphs.

Why: a batch size's first step compiles its kernels' specializations (Triton specializes an
integer argument on == 1 and on divisibility by 16) and captures its graph.  On a machine whose
Triton cache is cold that is seconds a batch size: measured on the H200 (fourteenth session,
the random 270M shape, 16 greedy clients), the first burst's graph captures took 16.2 s and its
median time to first token was 7.9 s, the second burst's 0.15 s.  Paid here, before the port
opens, a client never sees it.

The prompts are 1, 2, 4, ... 64 tokens (cycled over the sessions): the single-token path and
the chunk graphs' smaller buckets.  Every session ends empty (`Session.reset`): nothing a
request could see is left, and the bits of later steps do not depend on what ran here (one
arithmetic per token, docs/exactness.md).
"""
from __future__ import annotations

import time

from ..backends.greedy import FromLast
from ..errors import RequestError

PROMPTS = (1, 2, 4, 8, 16, 32, 64)


def warm_up(engine, sessions: list, steps=None) -> dict:
    """{} where there is nothing to warm (no decode runner: the CPU, the oracle); else
    {"batches", "seconds", "captures"}.  `sessions` must be empty; they are empty after."""
    for s in sessions:
        if s.position:
            raise RequestError(f"warm_up expected empty sessions; found one at position "
                               f"{s.position}")
    stats = engine.runner_stats
    if not sessions or engine.decode_runner() is None:
        return {}
    t0, before = time.perf_counter(), stats().get("captures", 0)
    tok = engine.spec.bos_token_id if engine.spec.bos_token_id is not None else 0
    per = 1 if steps is None else 2              # positions a batch size's steps take
    room = max(1, engine.max_context - per)
    try:
        for i, s in enumerate(sessions):
            s.prefill([tok] * min(PROMPTS[i % len(PROMPTS)], room), logits=False)
        for b in range(1, len(sessions) + 1):
            group = sessions[:b]
            for s in group:                      # session 0 steps in every batch size: a short
                if s.position + per > engine.max_context:         # context starts it over
                    s.reset()
                    s.prefill([tok], logits=False)
            if steps is not None:              # as a pipelined round: a host id, then the
                first = steps.launch(group, [tok] * b)         # step's own picks, launched
                second = steps.launch(group, [FromLast(i) for i in range(b)])  # before reading
                steps.collect(first)
                steps.collect(second)
            else:
                engine.decode_batch(group, [tok] * b)
    finally:
        for s in sessions:
            s.reset()
    return {"batches": len(sessions), "seconds": time.perf_counter() - t0,
            "captures": stats().get("captures", 0) - before}
