"""A request as the worker sees it: a `Job`, and the events its asyncio queue receives.

Owns: the job's fields (what was asked, where it runs, the worker's progress on it) and
`emit`, the way the worker thread sends the request an event (through the loop's outbox.py).
Does not own: what the events mean to HTTP (responses.py) or how the worker runs the job
(scheduler.py, prefill_rounds.py, decode_rounds.py).

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
import threading
from dataclasses import dataclass, field
from typing import Any

from ..errors import CacheOverflow, ContextOverflow, RequestError
from .choices import Choice, Decoding
from .outbox import Outbox
from .slots import Placement

SAFE_ERRORS = (RequestError, ContextOverflow, CacheOverflow)   # refused before any write


@dataclass(eq=False)
class Job:
    placement: Placement
    decoding: Decoding
    max_new: int
    stops: list[str]
    outbox: Outbox                     # the request's event loop, reached from the worker
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
    # where events go on the loop: None = `events` (a consumer awaits them); else a callable
    # taking each event as it arrives (a pushed stream).  Read and set on the loop thread only
    sink: Any = None

    def cancel(self) -> None:
        self.cancelled.set()

    def emit(self, kind: str, *payload) -> None:
        self.outbox.post(self._deliver, (kind, *payload))

    def _deliver(self, event: tuple) -> None:          # on the loop
        if self.sink is None:
            self.events.put_nowait(event)
        else:
            self.sink(event)

    def subscribe(self, sink) -> None:
        """On the loop: send every event to `sink` from now on -- those already queued first,
        in order (the outbox delivers on this thread, so none arrives in between)."""
        while not self.events.empty():
            sink(self.events.get_nowait())
        self.sink = sink
