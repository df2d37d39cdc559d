"""The wire between `muser serve --front-process`'s two processes, and its engine end.

Owns: `Link` (messages batched per event-loop turn into one length-prefixed pickle frame),
`frames` (reading them), `serve_link` (the engine process's end: every request the front
forwards runs through the real ASGI app, its `receive` and `send` carried by the link),
`Lifespan` (the app's start-up and shut-down without an HTTP server) and `serve_split` (the
engine process's whole run: start the app, start the front, serve the link until it closes).
Does not own: the front process (front.py: sockets, HTTP parsing, the head guard) or anything
a request means (app.py).

Why two processes: at 16 streaming clients the HTTP side (h11 parsing and writing, Starlette's
send stack, one chunk per token per stream) held the GIL about a third of the time, taking
turns with the scheduler thread that drives the GPU (benchmarks/NOTES.md, eighteenth session).
The front owns the sockets; the engine process keeps the app whole -- every route, auth,
limits, the slots -- so a request means the same thing either way.

    client --HTTP--> front process (uvicorn)  --"open"/"recv"-->  engine process (the app)
           <-------- send(message)           <----"send"--------  send() posts, never waits
                                             <----"close"/"fail"- the app returned / raised

Messages are (kind, request id, payload); both processes are ours and the socket is a private
socketpair, so pickle is the wire.  Ordering: one request's messages keep their order (one
stream, batches in order).  Back-pressure: `send` in the engine never waits on a slow client;
the front queues that request's messages and writes them at the client's pace.
"""
from __future__ import annotations

import asyncio
import logging
import pickle
import signal
import socket
import struct
import subprocess
import sys
import threading

log = logging.getLogger("muser.server")

_HEAD = struct.Struct(">I")        # a frame's length, then the pickled list of messages
_SCOPE_KEYS = ("type", "asgi", "http_version", "method", "scheme", "path", "raw_path",
               "query_string", "root_path", "headers", "client", "server")


class Link:
    """One direction of the wire: `post` queues a message; every message posted in one turn of
    the event loop leaves as one frame (one pickle, one write) at the turn's end."""

    def __init__(self, writer: asyncio.StreamWriter):
        self.writer = writer
        self._batch: list[tuple] = []

    def post(self, message: tuple) -> None:
        if not self._batch:
            asyncio.get_running_loop().call_soon(self._flush)
        self._batch.append(message)

    def _flush(self) -> None:
        batch, self._batch = self._batch, []
        if batch and not self.writer.is_closing():
            data = pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL)
            self.writer.write(_HEAD.pack(len(data)) + data)


async def frames(reader: asyncio.StreamReader):
    """The batches a Link wrote, in order, until the other end closes."""
    while True:
        try:
            head = await reader.readexactly(_HEAD.size)
            data = await reader.readexactly(_HEAD.unpack(head)[0])
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        yield pickle.loads(data)


def plain_scope(scope: dict) -> dict:
    """The picklable part of an HTTP scope (the server's state and extensions stay behind)."""
    return {k: scope[k] for k in _SCOPE_KEYS if k in scope}


async def serve_link(app, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Run the front's requests through `app` until the front closes the link."""
    link, inbox, running = Link(writer), {}, set()

    async def run(rid: int, scope: dict) -> None:
        queue, gone = inbox[rid], []

        async def receive() -> dict:
            if gone:                               # Starlette may ask again after the end
                return {"type": "http.disconnect"}
            message = await queue.get()
            if message["type"] == "http.disconnect":
                gone.append(True)
            return message

        def post(message: dict) -> None:
            link.post(("send", rid, message))

        async def send(message: dict) -> None:
            post(message)

        try:
            # "muser.post": send without a coroutine (sse.SSEResponse pushes a stream's chunks
            # from the outbox's callback); the link never waits, so neither does it
            await app({**scope, "extensions": {"muser.post": post}}, receive, send)
            link.post(("close", rid, None))
        except Exception as exc:                   # the app's handlers answer errors; this is
            log.exception("request %d failed in the app", rid)     # what escaped them
            link.post(("fail", rid, f"{type(exc).__name__}: {exc}"))
        finally:
            inbox.pop(rid, None)

    async for batch in frames(reader):
        for kind, rid, payload in batch:
            if kind == "open":
                inbox[rid] = asyncio.Queue()
                task = asyncio.create_task(run(rid, payload))
                running.add(task)
                task.add_done_callback(running.discard)
            elif kind == "recv" and rid in inbox:
                inbox[rid].put_nowait(payload)
    for queue in inbox.values():                   # the front is gone: so are its clients
        queue.put_nowait({"type": "http.disconnect"})
    if running:
        await asyncio.wait(running, timeout=5)


class Lifespan:
    """The app's lifespan protocol driven by hand: `await start()`, later `await stop()`."""

    def __init__(self, app):
        self.app, self._in, self._out = app, asyncio.Queue(), asyncio.Queue()
        self._task: asyncio.Task | None = None

    async def _step(self, kind: str) -> None:
        self._in.put_nowait({"type": f"lifespan.{kind}"})
        said = await self._out.get()
        if said["type"] != f"lifespan.{kind}.complete":
            raise RuntimeError(f"the app's {kind} failed: {said.get('message', said['type'])}")

    async def start(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
        self._task = asyncio.create_task(self.app(scope, self._in.get, self._out.put))
        await self._step("startup")

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            await self._step("shutdown")
            await self._task


def serve_split(app, config, log_level: str = "info", on_start=None) -> int:
    """`muser serve --front-process`: the app here (the engine's process), HTTP in a front
    process on config.host:port; `on_start(front)` is given its Popen once it runs (a test's
    handle).  Returns 0 after a clean stop (a signal or the front's own exit), 1 otherwise."""
    return asyncio.run(_serve_split(app, config, log_level, on_start))


async def _serve_split(app, config, log_level: str, on_start) -> int:
    life = Lifespan(app)
    await life.start()                             # the warm-up runs before the port opens
    ours, theirs = socket.socketpair()
    cmd = [sys.executable, "-m", "muser.server.front", "--fd", str(theirs.fileno()),
           "--host", config.host, "--port", str(config.port),
           "--header-timeout", str(config.header_timeout),
           "--max-header-bytes", str(config.max_header_bytes),
           "--max-connections", str(config.max_connections), "--log-level", log_level]
    front = subprocess.Popen(cmd, pass_fds=[theirs.fileno()])
    theirs.close()
    loop = asyncio.get_running_loop()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):   # a stop asked here stops the front;
            loop.add_signal_handler(sig, front.terminate)     # its link closing ends serve_link
    if on_start is not None:
        on_start(front)
    try:
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        await serve_link(app, reader, writer)
    finally:
        if front.poll() is None:
            front.terminate()
        rc = await loop.run_in_executor(None, front.wait)
        await life.stop()
    log.info("front process exited with %s", rc)
    return 0 if rc in (0, -signal.SIGTERM, -signal.SIGINT) else 1
