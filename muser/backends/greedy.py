"""Greedy decoding of several sessions for many steps: the pick, the result, the plain loop.

Owns: `greedy_rows` (each row's greedy token as the server's picker takes it -- NaN as -inf,
+inf as the largest float32, server/sampler.finite_logits -- and whether the row had a logit
left to choose), `Greedy` (what a run returns), `Budget` (the checked request) and
`decode_loop` -- one `Engine._forward` step at a time, every backend's way.  Does not own:
the CUDA pipeline that launches step N+1 before reading step N back (cuda/greedy.py), picking
with samplers or grammars (engine/picker.py), text (engine/generate.py).

What a run means, for session b with first token tokens[b] and budget m_b:

    feed = tokens[b]
    for i in range(m_b):
        t = greedy(decode(feed))          # one step; the session consumed `feed`
        if t in stops: finish "stop"      # not returned, not consumed
        out.append(t); feed = t
    finish "length"                       # the m_b-th token is returned, not consumed

so a session ends having consumed tokens[b] and every returned token but the last.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import CacheOverflow, RequestError

BIG = torch.finfo(torch.float32).max


def greedy_rows(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 logits [B, vocab] -> (token int64 [B], ok bool [B]): the first maximum of each
    row with NaN read as -inf and +inf as the largest float32 (what `picker.pick(finite_logits(
    row))` takes for a greedy picker); ok is False for a row with nothing but NaN and -inf."""
    mapped = torch.nan_to_num(logits, nan=float("-inf"), posinf=BIG, neginf=float("-inf"))
    top, best = mapped.max(-1)
    return best, top > float("-inf")


@dataclass
class Greedy:
    """A run's result per session: the tokens (a stop id is not among them) and why it ended:
    "stop" (a stop id came), "length" (the budget), "nonfinite" (a step's logits had no finite
    value: the session holds what it consumed up to and including that step)."""
    tokens: list[list[int]]
    finish: list[str]


@dataclass(frozen=True)
class Budget:
    """A checked run request: first tokens, per-session budgets, stop ids."""
    tokens: tuple[int, ...]
    budgets: tuple[int, ...]
    stops: frozenset[int]

    @staticmethod
    def check(engine, sessions, tokens, max_tokens, stop_ids) -> "Budget":
        """Refuse before anything runs: a session twice, counts that differ, an id out of the
        vocabulary, a negative budget, a budget past the context."""
        B = len(sessions)
        if len(tokens) != B:
            raise RequestError(f"decode_greedy got {B} sessions and {len(tokens)} tokens")
        if len({id(s) for s in sessions}) != B:
            raise RequestError("a session appears twice in one decode_greedy")
        budgets = [int(max_tokens)] * B if isinstance(max_tokens, int) else [int(m) for m in max_tokens]
        if len(budgets) != B:
            raise RequestError(f"decode_greedy got {B} sessions and {len(budgets)} budgets")
        vocab = engine.spec.vocab_size
        for s, t, m in zip(sessions, tokens, budgets):
            if m < 0:
                raise RequestError(f"max_tokens must be >= 0, got {m}")
            if not 0 <= int(t) < vocab:
                raise RequestError(f"token ids must be in [0, {vocab}), got {int(t)}")
            if s.position + m > engine.max_context:
                raise CacheOverflow(-1, engine.max_context, s.position + m)
            if s._open is not None:
                raise RequestError("decode_greedy on a session with an open checkpoint")
        stops = frozenset(int(i) for i in stop_ids)
        return Budget(tuple(int(t) for t in tokens), tuple(budgets), stops)


def settle(b: int, token: int, ok: bool, run: Budget, out: Greedy) -> bool:
    """Step result `token` (ok: the row had a logit to choose) for session b: recorded in `out`;
    True when b goes on (it will consume `token`)."""
    if not ok:
        out.finish[b] = "nonfinite"
        return False
    if token in run.stops:
        out.finish[b] = "stop"
        return False
    out.tokens[b].append(token)
    return len(out.tokens[b]) < run.budgets[b]


def decode_loop(engine, sessions, run: Budget) -> Greedy:
    """The run one step at a time: each step a batched forward of the live sessions, its picks
    read back before the next is launched."""
    out = Greedy([[] for _ in sessions], ["length"] * len(sessions))
    feed = list(run.tokens)
    live = [b for b, m in enumerate(run.budgets) if m > 0]
    while live:
        logits = engine._forward([sessions[b] for b in live], [[feed[b]] for b in live],
                                 False, False)
        best, ok = greedy_rows(logits)
        best, ok = torch.stack([best, ok.long()]).tolist()
        nxt = []
        for j, b in enumerate(live):
            if settle(b, best[j], bool(ok[j]), run, out):
                feed[b] = best[j]
                nxt.append(b)
        live = nxt
    return out
