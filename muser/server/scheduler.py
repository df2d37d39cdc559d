"""The worker: one thread that runs every model step and feeds per-request queues.

Owns: the worker thread and its loop (the time share between prefill and decode rounds),
submitting and waking, ending a choice or a job, the line between a request's failure and the
pool's, and latching the pool unhealthy when a model step fails.  The rounds themselves live in
prefill_rounds.py, decode_rounds.py and pipeline.py (methods of this class); a request's fields and events
in job.py.  Does not own: placement or the queue (slots.py), HTTP (app.py), the prefix cache
(prefix.py).

Failure containment: a model step (prefill / decode) that raises latches the
pool unhealthy -- the cache's state is in doubt.  Anything else that goes
wrong for one request (its sampling, detokenisation, stop handling, a logits
row with no finite value) fails that request alone: it gets an error event
(or a 4xx / 500 answer), its slot is released with a consistent cache, and
every other request goes on.
"""
from __future__ import annotations

import logging
import sys
import threading
import time

from ..errors import MuserError
from .choices import Choice
from .decode_rounds import DecodeRounds
from .http_errors import Internal, ServerError, Unavailable, to_http
from .job import SAFE_ERRORS, Job
from .pipeline import PipelinedRounds
from .prefill_rounds import PrefillRounds
from .sampler import NonFiniteLogits
from .slots import SlotPool

log = logging.getLogger("muser.server")
__all__ = ["Job", "Scheduler", "SAFE_ERRORS"]


class Scheduler(PrefillRounds, DecodeRounds, PipelinedRounds):
    def __init__(self, engine, pool: SlotPool, metrics, max_context: int,
                 batch_decode: bool = True, tokenizer=None, prefill_budget: int | None = None,
                 prefill_share: float = 0.5, prefix=None, stream_interval: int = 1):
        self.engine, self.pool, self.metrics = engine, pool, metrics
        self.prefix = prefix                   # server.prefix.PrefixCache, or None (off)
        if tokenizer is None:
            from .text import SharedTokenizer
            tokenizer = SharedTokenizer(engine.tokenizer)
        self.tokenizer = tokenizer
        self.max_context = max_context
        self.batch_decode = batch_decode
        self.eos = set(engine.spec.eos_token_ids or ())
        self.eos |= set(self.tokenizer.eos_token_ids)
        self.chunk = max(1, int(getattr(getattr(engine, "config", None), "chunk_size", 512) or 512))
        self.prefill_budget = max(1, int(prefill_budget or self.chunk))
        if not 0.0 < prefill_share <= 1.0:
            raise ValueError(f"prefill_share must be in (0, 1], got {prefill_share}")
        self.prefill_share = prefill_share
        self.stream_interval = max(1, int(stream_interval))   # tokens between a choice's deltas
        self.clock = time.perf_counter     # what the time share is measured with (tests drive it)
        self._owed = 0.0                # seconds of decode the streams are owed after a prefill
        self._spare: list = []             # sessions for choices 1..n-1, reused across requests
        self.spec = None                   # SpecStep when the server speculates
        self.spec_max_batch = sys.maxsize  # ... in rounds with at most this many decoding choices
        self.steps = None                  # Engine.greedy_steps when greedy rounds pipeline
        self._flight = None                # pipeline.Flight: the step launched and not collected
        self._inbox: list[Job] = []
        self._active: list[Job] = []
        self._cond = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="muser-scheduler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def submit(self, job: Job) -> None:
        with self._cond:
            if self._stop:
                raise Unavailable("the server is shutting down")
            self._inbox.append(job)
            self._cond.notify_all()

    def wake(self) -> None:
        """A request was cancelled: let the worker notice even when idle."""
        with self._cond:
            self._cond.notify_all()

    # ------------------------------------------------------------------ loop
    def _decoding(self) -> bool:
        return any(not j.done and j.feed is None and any(not c.done and c.pending is not None for c in j.choices)
               for j in self._active)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stop and not self._inbox and not self._active:
                    self._cond.wait()
                if self._stop:
                    jobs, self._inbox = self._inbox + self._active, []
                    break
                new, self._inbox = self._inbox, []
            try:
                for job in new:
                    self._admit(job)
                if self._owed <= 0 or not self._decoding():
                    spent = self._prefill_round()
                    self._retire()
                    share = self.prefill_share
                    self._owed = spent * (1 - share) / share if self._decoding() else 0.0
                if self._decoding():
                    self._owed -= self._decode_round()
                    self._retire()
                else:
                    self._owed = 0.0
            except Exception as e:             # noqa: BLE001 -- never leave requests hanging
                log.exception("scheduler step failed")
                self._active += [j for j in new if not j.done and j not in self._active]
                self._fail_all(f"internal scheduler error {type(e).__name__}: {e}", e)
        for job in jobs:
            self._finish(job, error=Unavailable("the server is shutting down"))

    def _finish(self, job: Job, finish: str | None = None, error: BaseException | None = None) -> None:
        """End the whole job: every choice still running ends with `finish`."""
        if job.done:
            return
        job.done = True
        for c in job.choices:
            if not c.done:
                self._end(job, c, finish, quiet=error is not None or finish == "cancelled")
        if job.holds_staging:                 # a rebuild that did not publish: drop its rows
            job.holds_staging = False
            try:
                self.pool.staging.reset()
            finally:
                self.pool.staging_lock.release()
        for c in job.choices:                 # forked sessions go back to the spare list
            if c.forked:
                c.session.reset()
                self._spare.append(c.session)
                c.forked = False
        # Free the slot before the client can see the end: its next request must find it free.
        job.outbox.post(self.pool.release, job.placement.slot)
        if error is not None:
            job.emit("error", error)
            return
        job.emit("done", [c.finish for c in job.choices] or [finish],
                 sum(c.generated for c in job.choices))

    def _end(self, job: Job, c: Choice, finish: str | None, quiet: bool = False) -> None:
        """End one choice; the job ends when its last choice does."""
        self._leave_flight(c)                 # a step taken past its end goes back first
        c.done = True
        c.finish = "stop" if finish == "stop_string" else finish
        if quiet:
            return
        tail = ""
        if finish != "stop_string":
            try:
                tail = c.text.flush()
                thought = c.text.take_reasoning()
                if thought:
                    self._send(job, c)
                    job.emit("reasoning", c.index, thought)
            except Exception:                 # noqa: BLE001 -- a broken tail never blocks the end
                log.exception("flushing a request's text failed")
        c.held += tail
        self._send(job, c)
        job.emit("end", c.index, c.finish)
        if not job.done and all(x.done for x in job.choices):
            self._finish(job, finish)

    def _job_failed(self, job: Job, exc: BaseException, where: str, stage: str) -> None:
        """One request's own failure (not a model step's): that request alone ends."""
        if isinstance(exc, NonFiniteLogits):
            log.warning("slot %d: %s; the request fails, the server stays healthy",
                        job.placement.slot.id, exc)
            err: ServerError = Internal(f"{exc} (NaN or inf logits) for this request; "
                                        "the server stays healthy")
        elif isinstance(exc, (ServerError, MuserError)):
            err = to_http(exc)
        else:
            log.exception("slot %d: %s failed for one request; the server stays healthy",
                          job.placement.slot.id, where)
            err = Internal(f"internal error while {where} ({type(exc).__name__}); "
                           "this request failed, the server stays healthy")
        self.metrics.inc("request_failures_total", labels={"stage": stage})
        self._finish(job, error=err)

    def _retire(self) -> None:
        for job in self._active:
            if job.cancelled.is_set() and not job.done:
                self._finish(job, "cancelled")
        self._active = [j for j in self._active if not j.done]

    def _fail_all(self, reason: str, exc: BaseException) -> None:
        log.error("model step failed, pool latched unhealthy: %s", reason)
        self._flight = None                   # its sessions are in doubt with the rest
        self.pool.latch_unhealthy(reason)
        self.metrics.inc("model_failures_total")
        for job in self._active:
            self._finish(job, error=Unavailable(f"the model pool is unhealthy: {reason}"))
        self._active = []

    # ------------------------------------------------------------------ admission
