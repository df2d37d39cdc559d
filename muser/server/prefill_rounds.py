"""The worker's prefill side: admitting a job into a session, and prefill rounds.

Owns: admission (a cache-extending prefill of the new suffix, a cold prefill, an install from
the prefix cache, or a shift's rebuild: prefill into staging, publish by swap, empty the old
generation), single flight on a peer's cut, the prefill round, and starting a job's reply once
its prompt is in (the choices, their text streams, the first token).
Does not own: the loop, the time share or failure policy (scheduler.py), decoding
(decode_rounds.py), placement (slots.py) or the store (prefix.py).

Prefill and decode share the worker like this.  A prompt is prefilled in the
engine's chunks (chunk_size, cut exactly as one prefill call would cut it, so the
cache is bitwise what one call builds on any backend, including one whose row
results depend on the chunk's shape).  A prefill round runs whole chunks,
least-served job first, until `prefill_budget` prompt tokens are spent (always
at least one chunk).  While any stream is decoding,
prefill may take only `prefill_share` of the worker's time: after a prefill
round that took t seconds, decode rounds run for t * (1 - share) / share
seconds before the next prefill round.  So a near-max-context prompt slows
running streams to about `share` of their speed (2x at the default 0.5)
instead of stalling them for every chunk, and a short prompt admitted next
to a long one is not queued behind all of it.

With a prefix cache (prefix.py) admission installs the longest stored prefix
when it beats the slot's live tokens, and a prefill chunk also stops at each of
the request's cut points (the chunk is split there) to record a cut -- so the
cache is then what prefill(prefix) + prefill(suffix) builds, the store's
exactness contract; a shift's rebuild in staging neither installs nor records.
Single flight: a request whose prompt shares a prefix with one still
prefilling waits (without computing) until that one has recorded its cut, then
installs it.
"""
from __future__ import annotations

import logging
import time

from .channels import ChannelText
from .choices import PROMPT_LOGPROB_ROWS, Choice, fork_sessions, prompt_logprob_rows
from .http_errors import Overloaded, Unavailable
from .job import SAFE_ERRORS, Job
from .text import TextStream

log = logging.getLogger("muser.server")


class PrefillRounds:
    """Scheduler methods (a mixin over its state: pool, prefix, chunk, budgets, _active)."""

    def _admit(self, job: Job) -> None:
        """Choose what the job prefills into; the chunks run in `_prefill_round`."""
        p = job.placement
        if not self.pool.healthy:
            return self._finish(job, error=Unavailable(
                f"the model pool is unhealthy: {self.pool.unhealthy_reason}"))
        if job.cancelled.is_set():            # the client left while queued: no prefill for it
            return self._finish(job, "cancelled")
        if p.rebuild:                         # a shift: rebuild in staging, publish on success
            if not self.pool.staging_lock.acquire(blocking=False):
                return self._finish(job, error=Overloaded(
                    "the staging session is busy with another context shift; retry later"))
            job.holds_staging = True
            job.target = self.pool.staging
            job.target.reset()
            job.feed = list(p.prompt)
        else:
            job.target = p.slot.session
            if job.decoding.prompt_logprobs:  # every prompt row's logits are wanted: no reuse
                p.reuse = 0
                p.slot.session.reset()
                job.feed = list(p.prompt)
            elif self.prefix is not None and self._wait_for_peer(job):
                self._active.append(job)       # resumed by _resume_waiters
                return
            else:
                self._admit_slot(job)
        self._active.append(job)

    def _admit_slot(self, job: Job) -> None:
        p, s = job.placement, job.placement.slot.session
        live = p.reuse if p.reuse and s.tokens == p.prompt[:p.reuse] else 0
        if self.prefix is not None:           # the longest stored prefix, if longer than live
            p.reuse, p.stored = self.prefix.admit(s, p.prompt, live)
            p.cuts = self.prefix.plan_cuts(s, p.cuts, p.reuse, p.stored)
        else:
            p.reuse = live
            if not live:
                s.reset()
        job.feed = list(p.prompt[p.reuse:])

    def _wait_for_peer(self, job: Job) -> bool:
        """Single flight: a job still prefilling a prefix this prompt shares, up to a cut point
        past what the slot or the store holds, is let finish that cut; this job installs it."""
        p = job.placement
        have = max(p.reuse if p.slot.session.tokens == p.prompt[:p.reuse] else 0,
                   self.prefix.peek(p.prompt))
        peers = [(k, k.placement.prompt, k.placement.cuts, k.target.position) for k in self._active
                 if not k.done and k.feed is not None and not k.holds_staging and k.wait is None]
        job.wait = self.prefix.peer_cut(p.prompt, have, peers)
        if job.wait is not None:
            self.metrics.inc("prefix_cache_waits_total")
        return job.wait is not None

    def _resume_waiters(self) -> None:
        for job in self._active:
            if job.wait is None or job.done:
                continue
            peer, at = job.wait
            if peer.done or peer.feed is None or peer.target.position >= at:
                job.wait = None
                if job.cancelled.is_set():
                    self._finish(job, "cancelled")
                else:
                    self._admit_slot(job)

    def _prefill_round(self) -> float:
        """Whole chunks, least-served job first, until the token budget is spent; seconds taken.
        With a prefix cache a chunk also ends at the job's next cut point (a cut is recorded there)."""
        if self.prefix is not None:
            self._resume_waiters()
        jobs = [j for j in self._active if not j.done and j.feed is not None]
        jobs.sort(key=lambda j: j.chunks_done)       # stable: arrival order among equals
        used, t_round = 0, self.clock()
        for job in jobs:
            if job.cancelled.is_set():
                self._finish(job, "cancelled")
                continue
            n = PROMPT_LOGPROB_ROWS if job.decoding.prompt_logprobs else self.chunk
            if self.prefix is not None and not job.holds_staging and not job.decoding.prompt_logprobs:
                at = job.target.position      # stop at the next cut point
                n = min([n] + [c - at for c in job.placement.cuts if c > at])
            piece = job.feed[:n]
            if used and used + len(piece) > self.prefill_budget:
                continue                              # next round
            used += len(piece)
            t0 = time.perf_counter()
            try:
                if job.decoding.prompt_logprobs:
                    logits = self._prompt_logprobs(job, piece)
                else:
                    # a piece of a longer prompt (it ends at a cut point or the budget): no head
                    logits = job.target.prefill(piece, logits=len(piece) == len(job.feed))
            except SAFE_ERRORS as e:
                job.placement.slot.replay = None
                self._finish(job, error=e)
                continue
            except Exception as e:             # noqa: BLE001 -- any model failure latches
                where = "staging" if job.holds_staging else f"slot {job.placement.slot.id}"
                self._fail_all(f"prefill on {where} raised {type(e).__name__}: {e}", e)
                return self.clock() - t_round
            job.prefill_time += time.perf_counter() - t0
            job.chunks_done += 1
            job.feed = job.feed[len(piece):]
            if self.prefix is not None and not job.holds_staging \
                    and job.target.position in job.placement.cuts:
                self.prefix.put(job.target, "cut point")
            if not job.feed:
                try:
                    self._prefilled(job, logits)
                except Exception as e:         # noqa: BLE001 -- this request's own failure
                    self._job_failed(job, e, "starting the reply", "first_token")
        return self.clock() - t_round

    def _prefilled(self, job: Job, logits) -> None:
        p = job.placement
        job.feed = None
        if job.holds_staging:
            self.pool.publish_staging(p.slot)       # swap: cannot fail halfway
            job.holds_staging = False
            try:
                self.pool.staging.reset()           # empty the old generation, after the swap
            finally:
                self.pool.staging_lock.release()
            job.shifted = True
            self.metrics.inc("context_shifts_total")
            log.info("context shift on slot %d -> epoch %d: %s", p.slot.id, p.slot.epoch,
                     getattr(p.plan, "reason", ""))
        self.metrics.observe("prefill_seconds", job.prefill_time)
        self.metrics.inc("prefill_tokens_total", len(p.prompt) - p.reuse)
        p.slot.replay = job.replay(p.slot.epoch) if job.replay else None
        job.emit("start", {"slot": p.slot.id, "context_epoch": p.slot.epoch, "shifted": job.shifted,
                           "cached_tokens": p.reuse, "stored_tokens": p.stored,
                           "prompt_tokens": len(p.prompt),
                           "prefill_seconds": job.prefill_time})
        if job.decoding.prompt_logprobs:
            job.emit("prompt", job.prompt_picks)
        d = job.decoding
        try:
            first = d.picker(self.engine, 0, p.prompt)
            pickers = [first] + [d.picker(self.engine, i, p.prompt,
                                          first.constraint.fork() if first.constraint else None)
                                 for i in range(1, d.n)]
        except SAFE_ERRORS as e:
            return self._finish(job, error=e)
        sessions = [p.slot.session] + fork_sessions(self.engine, p.slot.session, d.n - 1, self._spare)
        def text():
            if d.channels:
                return ChannelText(self.tokenizer, job.stops, d.tool_calls)
            return TextStream(self.tokenizer, job.stops)
        job.choices = [Choice(i, s, pk, text(), forked=i > 0)
                       for i, (s, pk) in enumerate(zip(sessions, pickers))]
        for c in job.choices:
            if not job.done:
                self._take(job, c, logits)

    def _prompt_logprobs(self, job: Job, piece: list[int]):
        """Prefill `piece` keeping every row's logits; emit the prompt tokens' logprobs."""
        rows = job.target.extend(piece)                      # [len(piece), vocab]
        top = job.decoding.logprobs or 0
        picks, job.prompt_row = prompt_logprob_rows(rows, piece, job.prompt_row, top)
        job.prompt_picks += picks
        return rows[-1]

    # ------------------------------------------------------------------ decode
