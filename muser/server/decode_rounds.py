"""The worker's decode side: choosing each token, stop conditions, decode rounds.

Owns: taking a token from a row of logits (the picker, non-finite rows refused), what a token
does to its choice (text deltas, reasoning, stop strings, end of sequence, length), and the
decode round (one batched step or a speculative verification block for every decoding choice).
Does not own: the loop and failure policy (scheduler.py), prefill (prefill_rounds.py), rounds
one step ahead (pipeline.py).
"""
from __future__ import annotations

import torch

from ..engine.picker import Pick
from .choices import Choice
from .job import SAFE_ERRORS, Job
from .sampler import finite_logits


def greedy_picks(pickers: list, logits) -> dict[int, int]:
    """{row: token} for the rows of a batched step whose picker is plain greedy and whose logits
    are all finite: the argmax of every such row from one reduction and one read-back, where
    picking them one by one costs two device round trips a row (the finiteness check, the
    argmax) -- on CUDA ~0.5 ms a 16-session step.  The same token as `picker.pick(
    finite_logits(row))`: that is `argmax(row)` for a finite row, and argmax takes the first of
    equal maxima whether it reduces one row or many.  Rows left out go the usual way, and so
    does a one-session step (its logits come as a list): there `picker.pick` stays the one place
    a token is drawn, which tests/server/test_hostile.py uses to inject a failing draw."""
    rows = [i for i, p in enumerate(pickers) if getattr(p, "greedy_only", False)]
    if not rows or not torch.is_tensor(logits):
        return {}
    sel = logits if len(rows) == len(pickers) else logits[rows]        # [R, vocab]
    # a row is finite iff its max and its min are (both propagate NaN): two reductions, no
    # [R, vocab] mask; max's index is argmax's (the first of equal maxima)
    top, best = sel.max(-1)
    ok = torch.isfinite(top) & torch.isfinite(sel.amin(-1))
    ok, best = torch.stack([ok.long(), best]).tolist()
    return {i: t for i, f, t in zip(rows, ok, best) if f}


class DecodeRounds:
    """Scheduler methods (a mixin over its state: eos, metrics, engine, spec, _active)."""

    def _take(self, job: Job, c: Choice, logits, greedy: int | None = None) -> None:
        """Choose choice `c`'s next token from `logits` and decide whether it goes on.
        `greedy`: the token already chosen for a plain greedy picker (`greedy_picks`)."""
        if job.max_new <= 0:
            return self._end(job, c, "length")
        try:
            pick = Pick(greedy) if greedy is not None else c.picker.pick(finite_logits(logits))
        except SAFE_ERRORS as e:               # e.g. constraints that leave no token
            return self._finish(job, error=e)
        self._settle(job, c, pick)

    def _settle(self, job: Job, c: Choice, pick) -> None:
        """Emit choice `c`'s chosen token and decide whether it goes on (pending = it)."""
        tok = pick.token
        c.generated += 1
        self.metrics.inc("completion_tokens_total")
        if c.picker.logprobs is not None:
            c.picks.append(pick)
        if (tok in self.eos and not job.decoding.ignore_eos) or tok in job.decoding.stop_ids:
            return self._end(job, c, "stop")
        out, stopped = c.text.push(tok)
        thought = c.text.take_reasoning()
        if thought:
            self._send(job, c)                # held content first: events keep the text's order
            job.emit("reasoning", c.index, thought)
        c.held += out
        c.unsent += 1
        if not c.sent or c.unsent >= self.stream_interval:
            self._send(job, c)
        if stopped:
            return self._end(job, c, "stop_string")
        if c.picker.stopped:                  # the grammar is complete
            return self._end(job, c, "stop")
        if c.generated >= job.max_new or c.session.position - c.ahead >= self.max_context:
            return self._end(job, c, "length")
        c.pending = tok

    def _send(self, job: Job, c: Choice) -> None:
        """Choice c's held text and picks as one delta, if there are any.  With
        `stream_interval` N, `_settle` sends the first delta at once and then every N tokens
        (and `_end` the rest): N tokens a chunk, where a chunk costs the worker an event and
        the HTTP loop a JSON write -- the two threads share one GIL."""
        if c.held or c.picks:
            job.emit("delta", c.index, c.held, c.picks)
            c.held, c.picks = "", []
            c.unsent, c.sent = 0, True

    def _decode_round(self) -> float:
        """One decode step (or verification block) for every decoding choice; seconds taken."""
        work = [(j, c) for j in self._active if not j.done and j.feed is None
                for c in j.choices if not c.done and c.pending is not None]
        t_round = self.clock()
        if work and self._pipelines(work):
            return self._pipelined_round(work, t_round)
        if self._flight is not None:             # another kind of round: land the step in flight
            self._land()
            work = [(j, c) for j, c in work if not j.done and not c.done and c.pending is not None]
        if self.spec is not None and work and len(work) <= self.spec_max_batch:
            work = self._speculate(work)
        if not work:
            return self.clock() - t_round
        sessions = [c.session for _, c in work]
        tokens = [c.pending for _, c in work]
        t0 = self.clock()
        try:
            if self.batch_decode and len(work) > 1:
                logits = self.engine.decode_batch(sessions, tokens)
            else:
                logits = [s.decode(t) for s, t in zip(sessions, tokens)]
            quick = greedy_picks([c.picker for _, c in work], logits)
        except Exception as e:                 # noqa: BLE001
            self._fail_all(f"decode step for {len(work)} session(s) raised "
                           f"{type(e).__name__}: {e}", e)
            return self.clock() - t_round
        self.metrics.observe("decode_seconds", self.clock() - t0)
        for i, (job, c) in enumerate(work):
            c.pending = None
            if job.done:
                continue
            if job.cancelled.is_set():
                self._finish(job, "cancelled")
                continue
            try:
                self._take(job, c, logits[i], quick.get(i))
            except Exception as e:             # noqa: BLE001 -- this request's own failure
                self._job_failed(job, e, "sampling the next token", "decode")
        return self.clock() - t_round

    def _speculate(self, work: list) -> list:
        """Verify a drafted block for every choice that has drafts -- all of them in one forward
        where the engine shares chunks (each row the same bits as its own block) -- and settle
        them; the rest (returned) take the batched decode step."""
        rest, drafted = [], []
        for job, c in work:
            room = min(job.max_new - c.generated, self.max_context - c.session.position) - 1
            drafts = self.spec.drafts(c, room) if not job.cancelled.is_set() else []
            if drafts:
                drafted.append((job, c, drafts))
            else:
                rest.append((job, c))
        if not drafted:
            return rest
        t0 = self.clock()
        try:
            results = self.spec.verify(self.engine, [(c, d) for _, c, d in drafted])
        except Exception as e:                 # noqa: BLE001
            self._fail_all(f"verification of {len(drafted)} drafted block(s) raised "
                           f"{type(e).__name__}: {e}", e)
            return []
        self.metrics.observe("decode_seconds", self.clock() - t0)
        for (job, c, drafts), picks in zip(drafted, results):
            if isinstance(picks, BaseException):
                self._finish(job, error=picks)
                continue
            self.metrics.inc("draft_tokens_total", len(drafts))
            self.metrics.inc("accepted_draft_tokens_total", len(picks) - 1)
            c.draft_gate.record(len(picks))
            c.pending = None
            for pick in picks:
                self._settle(job, c, pick)
                if c.done or job.done:
                    break
        return rest
