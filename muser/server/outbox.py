"""The worker thread's one road to the event loop: an `Outbox` of calls run there in order.

Owns: handing work from the scheduler's thread to the asyncio loop -- a job's events (`Job.emit`)
and the slot's release -- in the order the worker posted them, with at most one wake-up of the
loop pending at a time.
Does not own: what the events are (job.py) or what the loop does with them (responses.py).

Why one outbox and not `loop.call_soon_threadsafe` per event: each such call writes to the
loop's self-pipe and wakes it, and the worker posts one event per token per choice -- a
16-session step at ~1,400 steps a second is ~23,000 wake-ups a second on a loop that also
formats every chunk, and both threads share the GIL with the step's host work.  Here a round's
posts ride one wake-up; while a delivery is pending, later posts join it:

    worker:  post(a) -> wake scheduled      post(b)   post(c)        post(d) -> wake scheduled
    loop:                         deliver: a b c (pending cleared)             deliver: d

Order is the posting order, across jobs: the scheduler frees a job's slot before the job's
"done" event, so a client that reads "done" and sends its next request finds the slot free.
"""
from __future__ import annotations

import asyncio
import threading
from collections import deque
from typing import Any, Callable


class Outbox:
    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._lock = threading.Lock()
        # invariant: _pending is True iff a deliver() is scheduled on the loop and has not yet
        # taken the items; every item in _items is taken by that deliver or a later one
        self._items: deque[tuple[Callable[[Any], Any], Any]] = deque()
        self._pending = False

    def post(self, fn: Callable[[Any], Any], arg: Any) -> None:
        """Any thread: run `fn(arg)` on the loop after everything posted before it."""
        with self._lock:
            self._items.append((fn, arg))
            if self._pending:
                return
            self._pending = True
        try:
            self.loop.call_soon_threadsafe(self._deliver)
        except RuntimeError:            # the loop is gone (shutdown): nobody is listening
            with self._lock:
                self._items.clear()
                self._pending = False

    def _deliver(self) -> None:
        with self._lock:
            items = list(self._items)
            self._items.clear()
            self._pending = False
        for fn, arg in items:
            try:
                fn(arg)
            except Exception as e:          # noqa: BLE001 -- one failing call never drops the rest
                self.loop.call_exception_handler({"message": "an outbox call failed",
                                                  "exception": e})
