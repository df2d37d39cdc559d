"""The worker: one thread that runs every model step and feeds per-request queues.

Owns: admitting leased requests (a cache-extending prefill of the new suffix,
a cold prefill, or a shift's rebuild: prefill into staging, publish by swap,
empty the old generation), the rounds -- prefill rounds and decode rounds --
sampling, stop conditions, text deltas, cancellation, the line between a
request's failure and the pool's, and latching the pool unhealthy when a model
step fails.  Does not own: placement or the queue (slots.py), HTTP (app.py), the
prefix cache itself (prefix.py).

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

Failure containment: a model step (prefill / decode) that raises latches the
pool unhealthy -- the cache's state is in doubt.  Anything else that goes
wrong for one request (its sampling, detokenisation, stop handling, a logits
row with no finite value) fails that request alone: it gets an error event
(or a 4xx / 500 answer), its slot is released with a consistent cache, and
every other request goes on.

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

from ..engine.sampling import SamplingParams
from ..errors import CacheOverflow, ContextOverflow, MuserError, RequestError
from .http_errors import Internal, Overloaded, ServerError, Unavailable, to_http
from .sampler import NonFiniteLogits, sample_safely
from .slots import Placement, SlotPool
from .text import TextStream

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
    stop_ids: frozenset = frozenset()  # extra stop tokens (a chat's turn markers)
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    # worker state
    generated: int = 0
    pending: int | None = None         # sampled, to be fed at the next decode step
    text: TextStream | None = None
    generator: Any = None
    done: bool = False
    shifted: bool = False
    target: Any = None                 # the session being prefilled (the slot's, or staging)
    feed: list[int] | None = None      # prompt ids still to prefill (None once decoding)
    chunks_done: int = 0               # prefill chunks run (least-served goes first)
    holds_staging: bool = False
    prefill_time: float = 0.0
    wait: Any = None                   # (peer job, position): single flight on a peer's cut

    def cancel(self) -> None:
        self.cancelled.set()

    def emit(self, kind: str, *payload) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, *payload))
        except RuntimeError:            # the loop is gone (shutdown)
            pass


class Scheduler:
    def __init__(self, engine, pool: SlotPool, metrics, max_context: int,
                 batch_decode: bool = True, tokenizer=None, prefill_budget: int | None = None,
                 prefill_share: float = 0.5, prefix=None):
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
        self.clock = time.perf_counter     # what the time share is measured with (tests drive it)
        self._owed = 0.0                # seconds of decode the streams are owed after a prefill
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
        return any(not j.done and j.feed is None and j.pending is not None for j in self._active)

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
        if job.done:
            return
        job.done = True
        if job.holds_staging:                 # a rebuild that did not publish: drop its rows
            job.holds_staging = False
            try:
                self.pool.staging.reset()
            finally:
                self.pool.staging_lock.release()
        tail = ""
        if error is None and job.text is not None and finish != "stop_string":
            try:
                tail = job.text.flush()
            except Exception:                 # noqa: BLE001 -- a broken tail never blocks the end
                log.exception("flushing a request's text failed")
        # Free the slot before the client can see the end: its next request must find it free.
        try:
            job.loop.call_soon_threadsafe(self.pool.release, job.placement.slot)
        except RuntimeError:                  # the loop is gone (shutdown)
            pass
        if error is not None:
            job.emit("error", error)
            return
        if tail:
            job.emit("delta", tail)
        job.emit("done", "stop" if finish == "stop_string" else finish, job.generated)

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
        self.pool.latch_unhealthy(reason)
        self.metrics.inc("model_failures_total")
        for job in self._active:
            self._finish(job, error=Unavailable(f"the model pool is unhealthy: {reason}"))
        self._active = []

    # ------------------------------------------------------------------ admission
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
            if self.prefix is not None and self._wait_for_peer(job):
                self._active.append(job)       # resumed by _resume_waiters
                return
            self._admit_slot(job)
        self._active.append(job)

    def _admit_slot(self, job: Job) -> None:
        p, s = job.placement, job.placement.slot.session
        live = p.reuse if p.reuse and s.tokens == p.prompt[:p.reuse] else 0
        if self.prefix is not None:           # the longest stored prefix, if longer than live
            p.reuse, p.stored = self.prefix.admit(s, p.prompt, live)
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
            n = self.chunk
            if self.prefix is not None and not job.holds_staging:   # stop at the next cut point
                at = job.target.position
                n = min([n] + [c - at for c in job.placement.cuts if c > at])
            piece = job.feed[:n]
            if used and used + len(piece) > self.prefill_budget:
                continue                              # next round
            used += len(piece)
            t0 = time.perf_counter()
            try:
                logits = job.target.prefill(piece)
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
        job.text = TextStream(self.tokenizer, job.stops)
        job.generator = job.sampling.generator()
        job.emit("start", {"slot": p.slot.id, "context_epoch": p.slot.epoch, "shifted": job.shifted,
                           "cached_tokens": p.reuse, "stored_tokens": p.stored,
                           "prompt_tokens": len(p.prompt),
                           "prefill_seconds": job.prefill_time})
        self._take(job, logits)

    # ------------------------------------------------------------------ decode
    def _take(self, job: Job, logits) -> None:
        """Sample the next token from `logits` and decide whether generation goes on."""
        if job.max_new <= 0:
            return self._finish(job, "length")
        tok = sample_safely(logits, job.sampling, job.generator)
        job.generated += 1
        self.metrics.inc("completion_tokens_total")
        if tok in self.eos or tok in job.stop_ids:
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

    def _decode_round(self) -> float:
        """One decode step for every decoding job; seconds taken."""
        jobs = [j for j in self._active if not j.done and j.feed is None and j.pending is not None]
        if not jobs:
            return 0.0
        sessions = [j.placement.slot.session for j in jobs]
        tokens = [j.pending for j in jobs]
        t0 = self.clock()
        try:
            if self.batch_decode and len(jobs) > 1:
                logits = self.engine.decode_batch(sessions, tokens)
            else:
                logits = [s.decode(t) for s, t in zip(sessions, tokens)]
        except Exception as e:                 # noqa: BLE001
            self._fail_all(f"decode step for {len(jobs)} slot(s) raised "
                           f"{type(e).__name__}: {e}", e)
            return self.clock() - t0
        spent = self.clock() - t0
        self.metrics.observe("decode_seconds", spent)
        for i, job in enumerate(jobs):
            job.pending = None
            if job.cancelled.is_set():
                self._finish(job, "cancelled")
                continue
            try:
                self._take(job, logits[i])
            except Exception as e:             # noqa: BLE001 -- this request's own failure
                self._job_failed(job, e, "sampling the next token", "decode")
        return spent
