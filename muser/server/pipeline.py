"""Greedy decode rounds one step ahead: the next step is launched before the last is settled.

Owns: the pipelined decode round (`_pipelined_round`), landing the step in flight before a
round of another kind (`_land`), and giving a choice's extra step back when it ends while in
flight (`_leave_flight`, called by `Scheduler._end`).  The steps themselves are the engine's
(`Engine.greedy_steps`: launch / collect / take_back, backends/greedy.py; on CUDA the graph
runner's, cuda/greedy.py).  Does not own: what a token does to its choice (decode_rounds.py:
`_settle`), the loop (scheduler.py).

Round R, with step N in flight (launched by round R - 1):

    launch N+1  for the choices whose next token is still wanted whatever N picks (budget and
                context left): fed N's picks on the device, or a host id (a choice just
                prefilled); c.pending = FromLast(row)
    collect N   the picks (the GPU is busy with N+1); each settles as a plain round would
    end         a choice that N's pick ends (a stop id or string, a grammar, a client gone) was in
                N+1 already: `_end` takes that step back (`take_back`: a plane rewind and the
                token off the lineage), before its session can leave with its slot

Each choice sees the same tokens as in a plain round (the step is the same, the pick is the
same greedy_rows argmax the plain round's `greedy_picks` takes), and its session ends holding
what the plain round's would -- a ring one old row shorter, which no later query reads.  Only
rounds whose every choice is plain greedy pipeline (no sampling, logprobs, grammar or
speculation); the step in flight lands first when another kind of round comes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..backends.greedy import FromLast
from ..engine.picker import Pick
from .sampler import NonFiniteLogits


@dataclass(eq=False)
class Flight:
    """The step launched last and not yet collected: its rows' (job, choice) and the choices
    that left it (their step taken back)."""
    step: object
    members: list
    gone: set = field(default_factory=set)


class PipelinedRounds:
    """Scheduler methods (a mixin over its state: steps, _flight, metrics, max_context)."""

    def _pipelines(self, work) -> bool:
        return (self.steps is not None and self.batch_decode and self.spec is None
                and all(c.picker.greedy_only for _, c in work))

    def _pipelined_round(self, work, t_round: float) -> float:
        old = self._flight
        nxt = [(j, c) for j, c in work if self._wants_more(j, c, old)]
        t0 = self.clock()
        self._flight = None
        if nxt:
            try:
                step = self.steps.launch([c.session for _, c in nxt], [c.pending for _, c in nxt])
            except Exception as e:             # noqa: BLE001
                self._fail_all(f"decode step for {len(nxt)} session(s) raised "
                               f"{type(e).__name__}: {e}", e)
                return self.clock() - t_round
            self._flight = Flight(step, nxt)
            self.metrics.inc("steps_ahead_total")
            for row, (_, c) in enumerate(nxt):
                c.pending = FromLast(row)
        if old is not None:
            self._settle_flight(old)
        self.metrics.observe("decode_seconds", self.clock() - t0)
        return self.clock() - t_round

    def _wants_more(self, job, c, old) -> bool:
        """Whether c takes the next step whatever its pick in flight turns out to be: a host id
        always; a pick in flight while budget and context are left after it."""
        if job.cancelled.is_set():
            return False
        if not isinstance(c.pending, FromLast):
            return True
        return c.generated + 1 < job.max_new and c.session.position < self.max_context

    def _settle_flight(self, flight: Flight) -> None:
        """Collect a step and settle each row as a plain round does (the choices fed its picks
        in the step launched since took them into their lineage)."""
        try:
            best, ok = self.steps.collect(flight.step)
        except Exception as e:                 # noqa: BLE001
            self._fail_all(f"decode step for {len(flight.members)} session(s) raised "
                           f"{type(e).__name__}: {e}", e)
            return
        ahead = self._flight.members if self._flight is not None else []
        rows = {id(c): FromLast(i) for i, (_, c) in enumerate(ahead)}
        for i, (job, c) in enumerate(flight.members):
            if job.done or c.done or c in flight.gone:
                continue
            c.pending = None
            if job.cancelled.is_set():
                self._finish(job, "cancelled")
                continue
            try:
                if not ok[i]:
                    raise NonFiniteLogits("the model produced no finite logit for the next token")
                c.ahead = 1 if id(c) in rows else 0
                self._take(job, c, None, best[i])
            except Exception as e:             # noqa: BLE001 -- this request's own failure
                self._job_failed(job, e, "sampling the next token", "decode")
            c.ahead = 0
            if not c.done and not job.done and id(c) in rows:
                c.pending = rows[id(c)]        # already fed, on the device

    def _land(self) -> None:
        """Settle the step in flight with nothing launched after it (a round of another kind
        comes, or the pool stops)."""
        old, self._flight = self._flight, None
        if old is not None:
            self._settle_flight(old)

    def _leave_flight(self, c) -> None:
        """c ends: if it is in the step in flight, that step is one it should not have taken."""
        f = self._flight
        if f is None or c in f.gone or not any(c is x for _, x in f.members):
            return
        f.gone.add(c)
        self.steps.take_back(c.session)
        self.metrics.inc("steps_taken_back_total")
