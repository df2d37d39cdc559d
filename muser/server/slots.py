"""The slot pool: N serving sessions, one hidden staging session, a bounded queue.

Owns: which slot a request is placed in (the free slot whose live context the
request's prompt extends the most -- or, when the prefix cache holds a longer
prefix, which any slot can install, the least recently used slot -- then the
slot of its own shifted lineage, then the least recently used), the bounded FIFO of waiting requests with its
wait limit, the health latch, each slot's context epoch and replay plan, and
the staging session with its swap (publishing a rebuilt context is an
exchange of two references: it cannot fail halfway).
Does not own: running model steps (scheduler.py) or deciding what a prompt
keeps (policy.py).  Placement and the queue run on the event loop thread; a
leased slot's session is touched only by the scheduler's worker thread.
"""
from __future__ import annotations

import asyncio
import itertools
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .http_errors import Overloaded, SlotBusy, Unavailable


@dataclass(eq=False)
class Slot:
    id: int
    session: Any                     # muser Session (prefill / decode / reset / tokens)
    busy: bool = False
    last_used: int = 0               # LRU clock tick of the last lease
    epoch: int = 0                   # context_epoch: advances on every shift
    replay: Any = None               # policy.ReplayPlan | raw_policy.RawReplay | None
    file_op: bool = False            # leased by save / restore (not by a request)

    @property
    def tokens(self) -> list[int]:
        return self.session.tokens


@dataclass
class Placement:
    slot: Slot
    prompt: list[int]                # the retained context, as token ids
    reuse: int                       # prompt tokens already live in the slot's cache
    rebuild: bool                    # a shift: prefill into staging, then swap
    plan: Any = None                 # policy.ChatPlan | raw_policy.RawPlan
    lineage: bool = False            # placed by the slot's shifted lineage
    queue_wait: float = 0.0
    cuts: tuple = ()                 # positions where the prefill records a cut (prefix cache)
    stored: int = 0                  # prompt tokens installed from the prefix cache (admission)


def extension(slot_tokens: Sequence[int], prompt: Sequence[int]) -> int:
    """How many cached tokens `prompt` reuses: all of the slot's, if it strictly extends them."""
    n = len(slot_tokens)
    if 0 < n < len(prompt) and list(prompt[:n]) == list(slot_tokens):
        return n
    return 0


@dataclass(frozen=True)
class Candidate:
    """The prompt a request would send to one slot (plans differ by lineage)."""

    prompt: list[int]
    plan: Any
    shifted: bool                    # the plan dropped context
    lineage: bool = False            # built from this slot's replay plan
    cuts: tuple = ()                 # prefix-cache cut points of `prompt`


def choose(free: Sequence[Slot], candidate: Callable[[Slot], Candidate],
           peek: Callable[[list[int]], int] | None = None) -> Placement:
    """Most reuse first -- a slot's live tokens, or the prefix cache's longest stored prefix
    (`peek`), which any slot can install; then the slot holding the request's own lineage;
    then LRU (so a stored prefix goes to the least recently used slot)."""
    if not free:
        raise ValueError("choose() needs at least one free slot")
    best, best_key = None, None
    peeked: dict[int, int] = {}
    for slot in free:
        c = candidate(slot)
        reuse = extension(slot.tokens, c.prompt)
        if peek is not None and not c.shifted and id(c.prompt) not in peeked:
            peeked[id(c.prompt)] = peek(c.prompt)
        key = (max(reuse, peeked.get(id(c.prompt), 0)), c.lineage, -slot.last_used, -slot.id)
        if best_key is None or key > best_key:
            best, best_key = (slot, c, reuse), key
    slot, c, reuse = best
    return Placement(slot, c.prompt, reuse, rebuild=(reuse == 0 and c.shifted), plan=c.plan,
                     lineage=c.lineage, cuts=c.cuts)


@dataclass(eq=False)
class _Waiter:
    candidate: Callable[[Slot], Candidate]
    future: asyncio.Future
    enqueued: float = 0.0


class SlotPool:
    def __init__(self, sessions: Sequence[Any], staging: Any, max_queue: int = 64,
                 queue_timeout: float = 60.0, peek: Callable[[list[int]], int] | None = None):
        if not sessions:
            raise ValueError("a slot pool needs at least one slot")
        self.slots = [Slot(i, s) for i, s in enumerate(sessions)]
        self.staging = staging                    # never serves a request
        self.peek = peek                          # prefix cache: stored tokens for a prompt
        self.staging_lock = threading.Lock()
        self.max_queue = max_queue
        self.queue_timeout = queue_timeout
        self._waiters: deque[_Waiter] = deque()
        self._clock = itertools.count(1)
        self._health_lock = threading.Lock()
        self.unhealthy_reason: str | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------ health
    @property
    def healthy(self) -> bool:
        return self.unhealthy_reason is None

    def latch_unhealthy(self, reason: str) -> None:
        """Any thread.  The first reason sticks; queued requests are refused."""
        with self._health_lock:
            if self.unhealthy_reason is None:
                self.unhealthy_reason = reason
        if self.loop is not None and not self.loop.is_closed():
            try:
                self.loop.call_soon_threadsafe(self._fail_waiters)
            except RuntimeError:
                pass

    def check_healthy(self) -> None:
        if self.unhealthy_reason is not None:
            raise Unavailable(f"the model pool is unhealthy: {self.unhealthy_reason}")

    def _fail_waiters(self) -> None:
        while self._waiters:
            w = self._waiters.popleft()
            if not w.future.done():
                w.future.set_exception(Unavailable(
                    f"the model pool is unhealthy: {self.unhealthy_reason}"))

    # ------------------------------------------------------------------ leases (event loop)
    @property
    def busy_count(self) -> int:
        return sum(s.busy for s in self.slots)

    @property
    def queue_depth(self) -> int:
        return len(self._waiters)

    def _free(self) -> list[Slot]:
        return [s for s in self.slots if not s.busy]

    def _lease(self, candidate: Callable[[Slot], Candidate]) -> Placement:
        p = choose(self._free(), candidate, self.peek)
        p.slot.busy = True
        p.slot.last_used = next(self._clock)
        return p

    async def acquire(self, candidate: Callable[[Slot], Candidate]) -> Placement:
        """Lease the best free slot, waiting in the bounded FIFO when all are busy."""
        self.check_healthy()
        if not self._waiters and self._free():
            return self._lease(candidate)
        if len(self._waiters) >= self.max_queue:
            raise Overloaded(f"all {len(self.slots)} slots are busy and the queue is full "
                             f"({self.max_queue} waiting); retry later")
        loop = asyncio.get_running_loop()
        w = _Waiter(candidate, loop.create_future(), loop.time())
        self._waiters.append(w)
        try:
            p = await asyncio.wait_for(asyncio.shield(w.future), self.queue_timeout)
        except (asyncio.TimeoutError, asyncio.CancelledError) as e:
            if w in self._waiters:
                self._waiters.remove(w)
            if w.future.done() and not w.future.cancelled() and w.future.exception() is None:
                self.release(w.future.result().slot)         # leased as we gave up
            if isinstance(e, asyncio.TimeoutError):
                raise Overloaded(f"waited {self.queue_timeout:g}s for a free slot "
                                 f"({len(self.slots)} slots busy); retry later") from None
            raise
        p.queue_wait = loop.time() - w.enqueued
        return p

    def release(self, slot: Slot) -> None:
        """Event loop thread: free `slot` and hand free slots to the oldest waiters."""
        slot.busy = slot.file_op = False
        while self._waiters and self._free():
            if not self.healthy:
                self._fail_waiters()
                return
            w = self._waiters.popleft()
            if w.future.done():
                continue
            try:
                w.future.set_result(self._lease(w.candidate))
            except Exception as e:              # a broken candidate fails its own request only
                w.future.set_exception(e)

    def lease_slot(self, slot_id: int) -> Slot:
        """Lease one named slot now (save / restore); SlotBusy naming what holds it up."""
        self.check_healthy()
        slot = self.slots[slot_id]
        queued = len(self._waiters)
        if slot.busy:
            doing = "being saved or restored" if slot.file_op else "serving a request"
            then = (f", and {queued} queued request(s) will take the next free slot first; retry "
                    "when no request is queued" if queued else "; retry when it is idle")
            raise SlotBusy(f"slot {slot_id} is {doing}{then}")
        if queued:
            # the slot is idle, but leasing it now would jump the queue of waiting requests
            raise SlotBusy(f"slot {slot_id} is idle, but {queued} request(s) are queued for a "
                           "slot and go first; retry when the queue is empty")
        slot.busy, slot.file_op = True, True
        return slot

    # ------------------------------------------------------------------ staging (worker)
    def publish_staging(self, slot: Slot) -> None:
        """Swap the freshly prefilled staging session into `slot`; the old one becomes staging."""
        slot.session, self.staging = self.staging, slot.session
        slot.epoch += 1
