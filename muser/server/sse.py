"""Server-sent events: the stream's framing and its cheap paths.

Owns: `SSEResponse` (text/event-stream from chunks -- dicts, or `data:` frames already
encoded -- ending in `data: [DONE]`; pushed where the sender never waits) and `TextFrames` (a
stream's plain text chunks serialized from a template made once per request and choice).
Does not own: what a chunk says (bodies.py, responses.Formatter).

Why frames from a template: the HTTP loop shares the GIL with the worker thread, and at 16
streams it writes one chunk per token per stream.  A plain text chunk differs from the next
only in its text, so the JSON around it is made once: the frame is prefix + the text's JSON
string + suffix (json encodes a string the same wherever it sits), ~1.3 against ~6.3 us for
building the dict and dumping it (benchmarks/NOTES.md, eighteenth session).
"""
from __future__ import annotations

import asyncio
import json
from typing import AsyncIterator, Callable

from starlette.responses import Response

_MARK = "\x00muser-text\x00"                    # the text's place in a template chunk


def frame(chunk: dict) -> bytes:
    """One SSE `data:` frame of a chunk."""
    return f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n".encode()


class TextFrames:
    """Frames of one chunk shape whose only change is a text: `make(text)` builds the chunk
    (a dict holding `text` once, as a string value); frame(make(t)) == TextFrames(make)(t)."""

    def __init__(self, make: Callable[[str], dict]):
        mark = json.dumps(_MARK, ensure_ascii=False).encode()
        head, found, tail = frame(make(_MARK)).partition(mark)
        if not found or mark in tail:
            raise ValueError("a text frame template must hold its text exactly once")
        self.head, self.tail = head, tail

    def __call__(self, text: str) -> bytes:
        return b"".join((self.head, json.dumps(text, ensure_ascii=False).encode(), self.tail))


class SSEResponse(Response):
    """text/event-stream from an async iterator of chunks (a dict, or a frame already encoded:
    bytes); ends with `data: [DONE]`.

    Pushed (`push` = (job, shape) and a scope whose extensions carry "muser.post", a sender
    that never waits -- the --front-process engine side, bridge.py): each event the job's
    outbox delivers is shaped and posted there and then, in the outbox's own callback, instead
    of waking the stream's task through its queue -- one task switch and two queue operations
    a token less for the loop that shares the GIL with the scheduler.  The start still goes
    through `send` (the app's error middleware must know the response has begun)."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[dict | bytes], finalize: Callable[[], None],
                 push: tuple | None = None):
        self.status_code, self.background = 200, None
        self.raw_headers = [(b"content-type", b"text/event-stream; charset=utf-8"),
                            (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
        self.events, self.finalize, self.push = events, finalize, push

    async def __call__(self, scope, receive, send) -> None:
        post = (scope.get("extensions") or {}).get("muser.post")
        if post is not None and self.push is not None:
            return await self._pushed(send, post)
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for ev in self.events:
                data = ev if isinstance(ev, bytes) else frame(ev)
                await send({"type": "http.response.body", "body": data, "more_body": True})
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n",
                        "more_body": False})
        except OSError:
            pass
        finally:
            self.finalize()

    async def _pushed(self, send, post: Callable[[dict], None]) -> None:
        job, shape = self.push
        ended = asyncio.get_running_loop().create_future()

        def body(chunk) -> None:
            post({"type": "http.response.body", "more_body": True,
                  "body": chunk if isinstance(chunk, bytes) else frame(chunk)})

        def on_event(ev: tuple) -> None:       # on the loop, inside the outbox's delivery
            if ended.done():
                return
            try:
                chunks, end = shape.feed(ev)
                for chunk in chunks:
                    body(chunk)
            except Exception as e:             # noqa: BLE001 -- raised where the task awaits
                ended.set_exception(e)
                return
            if end:
                ended.set_result(None)

        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            for chunk in shape.opening():
                body(chunk)
            job.subscribe(on_event)
            await ended
            post({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})
        finally:
            if not ended.done():               # cancelled: later events find it closed
                ended.cancel()
            self.finalize()
