"""The worker: one thread that runs every model step and feeds per-request queues.

Owns: admitting leased requests (a cache-extending prefill of the new suffix,
a cold prefill, or a shift's rebuild: prefill into staging, publish by swap,
empty the old generation), one decode step for all active slots per round
(batched through `engine.decode_batch`), sampling, stop conditions, text
deltas, cancellation, and latching the pool unhealthy when a model step fails.
Does not own: placement or the queue (slots.py), HTTP (app.py).

Events a request's asyncio queue receives, in order:
  ("start", info)  ("delta", text)*  then ("done", finish, n_generated) or ("error", exc)
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..engine.sampling import SamplingParams, sample
from ..errors import CacheOverflow, ContextOverflow, RequestError
from .http_errors import Overloaded, Unavailable
from .slots import Placement, SlotPool
from .text import LockedTokenizer, TextStream

log = logging.getLogger("muser.server")
SAFE_ERRORS = (RequestError, ContextOverflow, CacheOverflow)   # refused before any write


@dataclass(eq=False)
class Job:
    placement: Placement
    sampling: SamplingParams
    max_new: int
    stops: list[str]
    loop: asyncio.AbstractEventLoop
    replay: Any = None                 # callable(epoch) -> replay plan stored on the slot
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    # worker state
    generated: int = 0
    pending: int | None = None         # sampled, to be fed at the next decode step
    text: TextStream | None = None
    generator: Any = None
    done: bool = False
    shifted: bool = False

    def cancel(self) -> None:
        self.cancelled.set()

    def emit(self, kind: str, *payload) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, *payload))
        except RuntimeError:            # the loop is gone (shutdown)
            pass


class Scheduler:
    def __init__(self, engine, pool: SlotPool, metrics, max_context: int,
                 batch_decode: bool = True, tokenizer=None):
        self.engine, self.pool, self.metrics = engine, pool, metrics
        self.tokenizer = tokenizer if tokenizer is not None else LockedTokenizer(engine.tokenizer)
        self.max_context = max_context
        self.batch_decode = batch_decode
        self.eos = set(engine.spec.eos_token_ids or ())
        self.eos |= set(self.tokenizer.eos_token_ids)
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
                self._retire()
                if self._active:
                    self._decode_round()
                    self._retire()
            except Exception as e:             # noqa: BLE001 -- never leave requests hanging
                log.exception("scheduler step failed")
                self._active += [j for j in new if not j.done and j not in self._active]
                self._fail_all(f"internal scheduler error {type(e).__name__}: {e}", e)
        for job in jobs:
            self._finish(job, error=Unavailable("the server is shutting down"))

    def _finish(self, job: Job, finish: str | None = None, error: BaseException | None = None) -> None:
        if job.done:
            return
        job.done = True
        if error is not None:
            job.emit("error", error)
        else:
            if job.text is not None:
                tail = job.text.flush() if finish != "stop_string" else ""
                if tail:
                    job.emit("delta", tail)
            job.emit("done", "stop" if finish == "stop_string" else finish, job.generated)
        slot = job.placement.slot
        try:
            job.loop.call_soon_threadsafe(self.pool.release, slot)
        except RuntimeError:
            pass

    def _retire(self) -> None:
        for job in self._active:
            if job.cancelled.is_set() and not job.done:
                self._finish(job, "cancelled")
        self._active = [j for j in self._active if not j.done]

    def _fail_all(self, reason: str, exc: BaseException) -> None:
        log.error("model step failed, pool latched unhealthy: %s", reason)
        self.pool.latch_unhealthy(reason)
        self.metrics.inc("model_failures_total")
        for job in self._active:
            self._finish(job, error=Unavailable(f"the model pool is unhealthy: {reason}"))
        self._active = []

    # ------------------------------------------------------------------ admission
    def _admit(self, job: Job) -> None:
        p = job.placement
        if not self.pool.healthy:
            return self._finish(job, error=Unavailable(
                f"the model pool is unhealthy: {self.pool.unhealthy_reason}"))
        if job.cancelled.is_set():            # the client left while queued: no prefill for it
            return self._finish(job, "cancelled")
        t0 = time.perf_counter()
        try:
            if p.rebuild:
                logits = self._rebuild(job)
                if logits is None:
                    return
            else:
                s = p.slot.session
                if p.reuse and s.tokens == p.prompt[:p.reuse]:
                    logits = s.prefill(p.prompt[p.reuse:])
                else:
                    p.reuse = 0
                    s.reset()
                    logits = s.prefill(p.prompt)
        except SAFE_ERRORS as e:
            p.slot.replay = None
            return self._finish(job, error=e)
        except Exception as e:                 # noqa: BLE001 -- any model failure latches
            self._active.append(job)
            return self._fail_all(f"prefill on slot {p.slot.id} raised {type(e).__name__}: {e}", e)
        dt = time.perf_counter() - t0
        self.metrics.observe("prefill_seconds", dt)
        self.metrics.inc("prefill_tokens_total", len(p.prompt) - p.reuse)
        p.slot.replay = job.replay(p.slot.epoch) if job.replay else None
        job.text = TextStream(self.tokenizer, job.stops)
        job.generator = job.sampling.generator()
        job.emit("start", {"slot": p.slot.id, "context_epoch": p.slot.epoch, "shifted": job.shifted,
                           "cached_tokens": p.reuse, "prompt_tokens": len(p.prompt),
                           "prefill_seconds": dt})
        self._active.append(job)
        self._take(job, logits)

    def _rebuild(self, job: Job):
        """A shift: prefill the retained context into staging; publish only on success."""
        pool, slot = self.pool, job.placement.slot
        if not pool.staging_lock.acquire(blocking=False):
            self._finish(job, error=Overloaded("the staging session is busy with another "
                                               "context shift; retry later"))
            return None
        try:
            staging = pool.staging
            staging.reset()
            logits = staging.prefill(job.placement.prompt)   # raises: the live session is untouched
            pool.publish_staging(slot)                       # swap: cannot fail halfway
            pool.staging.reset()                             # empty the old generation, after the swap
        finally:
            pool.staging_lock.release()
        job.shifted = True
        self.metrics.inc("context_shifts_total")
        log.info("context shift on slot %d -> epoch %d: %s", slot.id, slot.epoch,
                 getattr(job.placement.plan, "reason", ""))
        return logits

    # ------------------------------------------------------------------ decode
    def _take(self, job: Job, logits) -> None:
        """Sample the next token from `logits` and decide whether generation goes on."""
        if job.max_new <= 0:
            return self._finish(job, "length")
        tok = sample(logits, job.sampling, job.generator)
        job.generated += 1
        self.metrics.inc("completion_tokens_total")
        if tok in self.eos:
            return self._finish(job, "stop")
        if job.text is not None:
            out, stopped = job.text.push(tok)
            if out:
                job.emit("delta", out)
            if stopped:
                return self._finish(job, "stop_string")
        if job.generated >= job.max_new:
            return self._finish(job, "length")
        if job.placement.slot.session.position >= self.max_context:
            return self._finish(job, "length")
        job.pending = tok

    def _decode_round(self) -> None:
        jobs = [j for j in self._active if not j.done and j.pending is not None]
        if not jobs:
            return
        sessions = [j.placement.slot.session for j in jobs]
        tokens = [j.pending for j in jobs]
        t0 = time.perf_counter()
        try:
            if self.batch_decode and len(jobs) > 1:
                logits = self.engine.decode_batch(sessions, tokens)
            else:
                logits = [s.decode(t) for s, t in zip(sessions, tokens)]
        except Exception as e:                 # noqa: BLE001
            return self._fail_all(f"decode step for {len(jobs)} slot(s) raised "
                                  f"{type(e).__name__}: {e}", e)
        self.metrics.observe("decode_seconds", time.perf_counter() - t0)
        for i, job in enumerate(jobs):
            job.pending = None
            if job.cancelled.is_set():
                self._finish(job, "cancelled")
            else:
                self._take(job, logits[i])
