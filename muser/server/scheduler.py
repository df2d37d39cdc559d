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
  ("start", info)  ("prompt", picks)?  ("delta", index, text, picks)* and, for a harmony chat,
  ("reasoning", index, text)* between them  ("end", index, finish)*
  then ("done", [finish per choice], n_generated in all) or ("error", exc)
A request with n > 1 decodes n choices (choices.py): the prompt is prefilled once, the
other n-1 sessions start from its cut by snapshot install, and every choice's session
joins the batched decode step.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import CacheOverflow, ContextOverflow, MuserError, RequestError
from .choices import PROMPT_LOGPROB_ROWS, Choice, Decoding, fork_sessions, prompt_logprob_rows
from .http_errors import Internal, Overloaded, ServerError, Unavailable, to_http
from .sampler import NonFiniteLogits, finite_logits
from .slots import Placement, SlotPool
from .channels import ChannelText
from .text import TextStream

log = logging.getLogger("muser.server")
SAFE_ERRORS = (RequestError, ContextOverflow, CacheOverflow)   # refused before any write


@dataclass(eq=False)
class Job:
    placement: Placement
    decoding: Decoding
    max_new: int
    stops: list[str]
    loop: asyncio.AbstractEventLoop
    replay: Any = None                 # callable(epoch) -> replay plan stored on the slot
    stop_ids: frozenset = frozenset()  # extra stop tokens (a chat's turn markers)
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    # worker state
    choices: list[Choice] = field(default_factory=list)
    done: bool = False
    shifted: bool = False
    target: Any = None                 # the session being prefilled (the slot's, or staging)
    feed: list[int] | None = None      # prompt ids still to prefill (None once decoding)
    chunks_done: int = 0               # prefill chunks run (least-served goes first)
    holds_staging: bool = False
    prefill_time: float = 0.0
    prompt_row: Any = None             # last log-softmaxed prompt row (prompt logprobs)
    prompt_picks: list = field(default_factory=list)
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
        self._spare: list = []             # sessions for choices 1..n-1, reused across requests
        self.spec = None                   # SpecStep when the server speculates
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
        try:
            job.loop.call_soon_threadsafe(self.pool.release, job.placement.slot)
        except RuntimeError:                  # the loop is gone (shutdown)
            pass
        if error is not None:
            job.emit("error", error)
            return
        job.emit("done", [c.finish for c in job.choices] or [finish],
                 sum(c.generated for c in job.choices))

    def _end(self, job: Job, c: Choice, finish: str | None, quiet: bool = False) -> None:
        """End one choice; the job ends when its last choice does."""
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
                    job.emit("reasoning", c.index, thought)
            except Exception:                 # noqa: BLE001 -- a broken tail never blocks the end
                log.exception("flushing a request's text failed")
        if tail or c.picks:
            job.emit("delta", c.index, tail, c.picks)
            c.picks = []
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
    def _take(self, job: Job, c: Choice, logits) -> None:
        """Choose choice `c`'s next token from `logits` and decide whether it goes on."""
        if job.max_new <= 0:
            return self._end(job, c, "length")
        try:
            pick = c.picker.pick(finite_logits(logits))
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
        if tok in self.eos or tok in job.decoding.stop_ids:
            return self._end(job, c, "stop")
        out, stopped = c.text.push(tok)
        thought = c.text.take_reasoning()
        if thought:
            job.emit("reasoning", c.index, thought)
        if out or c.picks:
            job.emit("delta", c.index, out, c.picks)
            c.picks = []
        if stopped:
            return self._end(job, c, "stop_string")
        if c.picker.stopped:                  # the grammar is complete
            return self._end(job, c, "stop")
        if c.generated >= job.max_new or c.session.position >= self.max_context:
            return self._end(job, c, "length")
        c.pending = tok

    def _decode_round(self) -> float:
        """One decode step (or verification block) for every decoding choice; seconds taken."""
        work = [(j, c) for j in self._active if not j.done and j.feed is None
                for c in j.choices if not c.done and c.pending is not None]
        t_round = self.clock()
        if self.spec is not None and work:
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
                self._take(job, c, logits[i])
            except Exception as e:             # noqa: BLE001 -- this request's own failure
                self._job_failed(job, e, "sampling the next token", "decode")
        return self.clock() - t_round

    def _speculate(self, work: list) -> list:
        """Verify a drafted block for every choice that has drafts; the rest (returned) take
        the batched decode step."""
        rest = []
        for job, c in work:
            room = min(job.max_new - c.generated, self.max_context - c.session.position) - 1
            drafts = self.spec.drafts(c, room) if not job.cancelled.is_set() else []
            if not drafts:
                rest.append((job, c))
                continue
            t0 = self.clock()
            try:
                picks = self.spec.run(c, drafts)
            except SAFE_ERRORS as e:
                self._finish(job, error=e)
                continue
            except Exception as e:             # noqa: BLE001
                self._fail_all(f"verification block on slot {job.placement.slot.id} raised "
                               f"{type(e).__name__}: {e}", e)
                return []
            self.metrics.observe("decode_seconds", self.clock() - t0)
            self.metrics.inc("draft_tokens_total", len(drafts))
            self.metrics.inc("accepted_draft_tokens_total", len(picks) - 1)
            c.pending = None
            for pick in picks:
                self._settle(job, c, pick)
                if c.done or job.done:
                    break
        return rest
