"""Greedy decoding of several sessions for many steps: the pick, the result, the plain loop.

Owns: `greedy_rows` (each row's greedy token as the server's picker takes it -- NaN as -inf,
+inf as the largest float32, server/sampler.finite_logits -- and whether the row had a logit
left to choose), `Greedy` (what a run returns), `Budget` (the checked request) and
`decode_loop` -- one `Engine._forward` step at a time, every backend's way --, and the steps
interface a pipeline offers (`Step`; launch / collect / take_back): `run_steps`, a run whose
next step is launched before the last is read back, and `SyncSteps`, the same interface one
forward at a time (any engine: the server's pipelined rounds on the CPU, tests).  Does not own:
the CUDA pipeline (cuda/greedy.py: `GreedySteps`), picking with samplers or grammars
(engine/picker.py), text (engine/generate.py).

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

from dataclasses import dataclass, field
from typing import Any

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


@dataclass(frozen=True)
class FromLast:
    """A feed that is the pick of row `row` of the step launched last (still on the device)."""
    row: int


@dataclass(eq=False)
class Step:
    """A launched greedy step: its sessions (row i = sessions[i]), the launcher's handle, and
    the sessions that consumed row i's pick in a later step (filled by that launch)."""
    sessions: list
    handle: Any
    consumers: dict = field(default_factory=dict)


def run_steps(steps, sessions, run: Budget) -> Greedy:
    """A run through `steps` (launch / collect / take_back) with the next step launched before
    the last one's picks are read: a session that a pick ends was in the next step already, and
    gives it back.  The same tokens, finishes and lineages as `decode_loop`."""
    out = Greedy([[] for _ in sessions], ["length"] * len(sessions))
    live = [b for b, m in enumerate(run.budgets) if m > 0]
    launched_for = dict.fromkeys(live, 0)
    feeds = {b: run.tokens[b] for b in live}          # an id, or a row of the step in flight
    pending, done = None, set()
    while live or pending:
        launched = None
        if live:
            step = steps.launch([sessions[b] for b in live], [feeds[b] for b in live])
            launched = (step, list(live))
            for b in live:
                launched_for[b] += 1
        if pending is not None:
            best, ok = steps.collect(pending[0])
            for j, b in enumerate(pending[1]):
                if b in done:
                    continue
                if not settle(b, best[j], ok[j], run, out):
                    done.add(b)
                    if launched is not None and b in launched[1]:
                        steps.take_back(sessions[b])
        pending = launched
        if launched is None:
            break
        live = [b for b in launched[1] if b not in done and launched_for[b] < run.budgets[b]]
        feeds = {b: FromLast(launched[1].index(b)) for b in live}
    return out


class SyncSteps:
    """launch / collect / take_back one forward at a time (any engine): the picks are read at
    launch, so a pipelined caller runs unchanged where no pipeline pays."""

    def __init__(self, engine):
        self.engine = engine
        self.last: Step | None = None

    def launch(self, sessions, feeds) -> Step:
        ids = [self.last.handle[0][f.row] if isinstance(f, FromLast) else int(f) for f in feeds]
        logits = self.engine._forward(list(sessions), [[i] for i in ids], False, False)
        best, ok = greedy_rows(logits)
        best, ok = torch.stack([best, ok.long()]).tolist()
        self.last = Step(list(sessions), (best, [bool(o) for o in ok]))
        return self.last

    def collect(self, step: Step) -> tuple[list[int], list[bool]]:
        return step.handle

    def take_back(self, session) -> None:
        take_back(session)


def take_back(session) -> None:
    """Undo a session's last step, which a pipeline took past the run's end: every plane one row
    back (metadata; cuda/greedy.py's module doc says why nothing a later query reads is lost),
    the token it consumed off its lineage.  Every `steps` implementation's `take_back`."""
    for p in session.planes:
        p.rewind((p.len - 1, p.origin_logical, p.origin_physical))
    session.tokens.pop()
