"""Driving an ASGI application in-process: its lifespan, and one request at a time.

Owns: `Lifespan` (the ASGI lifespan protocol: startup before the first
request, shutdown at the end -- muser's app starts and stops its worker
there) and `call(app, fwd)` -> an async iterator of ASGI send messages for
one `Forwarded` request.  The request body is delivered whole; when the
consumer stops iterating early (the client left, the ingress cancelled), the
app's next `receive()` reports `http.disconnect`, which is how muser's server
learns a client is gone, and the app's task is given a moment to finish.
Does not own: the app (muser.server.app.create_app) or what the messages mean.
"""
from __future__ import annotations

import asyncio
from typing import AsyncIterator

from .wire import Forwarded


class Lifespan:
    def __init__(self, app):
        self.app = app
        self._inbox: asyncio.Queue = asyncio.Queue()
        self._outbox: asyncio.Queue = asyncio.Queue()
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": {}}
        await self.app(scope, self._inbox.get, self._outbox.put)

    async def _step(self, send: str, expect: str) -> None:
        await self._inbox.put({"type": send})
        msg = await self._outbox.get()
        if msg["type"] != expect:
            raise RuntimeError(f"ASGI lifespan: expected {expect}, got {msg['type']}: "
                               f"{msg.get('message', '')}")

    async def startup(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())
        await self._step("lifespan.startup", "lifespan.startup.complete")

    async def shutdown(self) -> None:
        if self._task is None or self._task.done():
            return
        await self._step("lifespan.shutdown", "lifespan.shutdown.complete")
        await self._task


def scope_of(fwd: Forwarded) -> dict:
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1", "method": fwd.method, "scheme": "http",
            "path": fwd.path, "raw_path": fwd.path.encode(), "query_string": fwd.query,
            "root_path": "", "headers": [(k, v) for k, v in fwd.headers],
            "client": ("ingress", 0), "server": ("replica", 0), "state": {}}


async def call(app, fwd: Forwarded, grace_s: float = 5.0) -> AsyncIterator[dict]:
    """Run `app` on `fwd`; yield every message it sends (response start, body pieces)."""
    out: asyncio.Queue = asyncio.Queue()
    gone = asyncio.Event()
    delivered = False

    async def receive() -> dict:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": fwd.body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        if gone.is_set():
            raise OSError("the client is gone")       # muser's SSE writer stops on OSError
        await out.put(message)

    task = asyncio.get_running_loop().create_task(app(scope_of(fwd), receive, send))
    task.add_done_callback(lambda _t: out.put_nowait(None))
    try:
        while True:
            msg = await out.get()
            if msg is None:
                break
            yield msg
        if task.exception() is not None:
            raise task.exception()
    finally:
        gone.set()
        if not task.done():
            try:
                await asyncio.wait_for(asyncio.shield(task), grace_s)
            except (asyncio.TimeoutError, asyncio.CancelledError, Exception):  # noqa: BLE001
                task.cancel()
