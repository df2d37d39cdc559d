"""The HTTP front process of `muser serve --front-process`: sockets here, the app elsewhere.

Owns: `Front`, an ASGI app that forwards each HTTP request over the link to the engine
process (bridge.py) and writes back what the app sends, at each client's own pace; and `main`,
the process (`python -m muser.server.front --fd N ...`, started by bridge.serve_split): uvicorn
with the same head guard, connection cap and timeouts as the one-process server
(transport.uvicorn_config).
Does not own: what a request means (the app, in the engine process), the wire (bridge.py).

This process imports no torch and no model (`import muser` is lazy): it parses HTTP, frames
responses and keeps slow clients from stalling anyone, with a GIL of its own.  If the engine
process goes, every open request fails (500 if nothing was sent yet) and the front exits; if
the front goes, the engine process sees the link close and stops.
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import socket
import sys
from dataclasses import dataclass

from .bridge import Link, frames, plain_scope

log = logging.getLogger("muser.server")


class Front:
    """ASGI app: each HTTP request is "open"ed on the link, its receive messages forwarded, and
    what comes back sent to the client in order; the link is opened at start-up."""

    def __init__(self, sock: socket.socket):
        self.sock, self.link, self.server = sock, None, None
        self.waiting: dict[int, asyncio.Queue] = {}
        self.ids = itertools.count(1)

    async def _open(self) -> None:
        reader, writer = await asyncio.open_unix_connection(sock=self.sock)
        self.link = Link(writer)
        asyncio.create_task(self._dispatch(reader))

    async def _dispatch(self, reader) -> None:
        async for batch in frames(reader):
            for kind, rid, payload in batch:
                queue = self.waiting.get(rid)
                if queue is not None:
                    queue.put_nowait((kind, payload))
        log.error("the engine process closed the link: stopping the front")
        for queue in self.waiting.values():
            queue.put_nowait(("fail", "the engine process ended"))
        if self.server is not None:
            self.server.should_exit = True

    async def _pump(self, rid: int, receive) -> None:
        """The client's side of the request (body, then a disconnect) to the app."""
        while True:
            message = await receive()
            self.link.post(("recv", rid, message))
            if message["type"] == "http.disconnect":
                return

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await self._open()
                await send({"type": f"{message['type']}.complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        if scope["type"] != "http" or self.link is None:
            return
        rid, queue = next(self.ids), asyncio.Queue()
        self.waiting[rid] = queue
        self.link.post(("open", rid, plain_scope(scope)))
        pump = asyncio.create_task(self._pump(rid, receive))
        ended, started, client_gone, held = False, False, False, None
        try:
            while True:
                if held is None:
                    kind, payload = await queue.get()
                else:
                    (kind, payload), held = held, None
                if kind == "send" and _more(payload) and not queue.empty():
                    payload, held = _join_bodies(payload, queue)
                if kind == "close":
                    ended = True
                    return
                if kind == "fail":                 # what escaped the app's own handlers
                    ended = True
                    if not started:
                        await _server_error(send, payload)
                    return
                started = True
                if not client_gone:
                    try:
                        await send(payload)
                    except OSError:                # the client left mid-response: the pump
                        client_gone = True         # tells the app; drain what is in flight
        finally:
            pump.cancel()
            self.waiting.pop(rid, None)
            if not ended:                          # cancelled here first: the app must know
                self.link.post(("recv", rid, {"type": "http.disconnect"}))


def _more(message: dict) -> bool:
    return message["type"] == "http.response.body" and message.get("more_body", False)


def _join_bodies(message: dict, queue: asyncio.Queue) -> tuple[dict, tuple | None]:
    """A slow client's waiting body parts as one write (SSE frames stay whole frames, so the
    client still reads one event a chunk): (the joined message, the first message that did not
    join -- it goes next)."""
    parts = [message["body"]]
    while not queue.empty():
        kind, payload = nxt = queue.get_nowait()
        if kind != "send" or not _more(payload):
            return {**message, "body": b"".join(parts)}, nxt
        parts.append(payload["body"])
    return {**message, "body": b"".join(parts)}, None


async def _server_error(send, why: str) -> None:
    """A 500 in OpenAI's error shape (the app's own handlers answer everything they can)."""
    body = json.dumps({"error": {"message": f"internal error in the engine process: {why}",
                                 "type": "server_error", "param": None, "code": 500}}).encode()
    await send({"type": "http.response.start", "status": 500,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


@dataclass(frozen=True)
class FrontSettings:
    """What uvicorn_config reads from a ServerConfig: the front's share of it (no secrets)."""
    header_timeout: float
    max_header_bytes: int
    max_connections: int


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    from .transport import uvicorn_config
    ap = argparse.ArgumentParser(prog="python -m muser.server.front")
    ap.add_argument("--fd", type=int, required=True, help="the link's socket (inherited)")
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--header-timeout", type=float, required=True)
    ap.add_argument("--max-header-bytes", type=int, required=True)
    ap.add_argument("--max-connections", type=int, required=True)
    ap.add_argument("--log-level", default="info")
    args = ap.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s front %(message)s")
    front = Front(socket.socket(fileno=args.fd))
    settings = FrontSettings(args.header_timeout, args.max_header_bytes, args.max_connections)
    server = uvicorn.Server(uvicorn_config(front, settings, host=args.host, port=args.port,
                                           log_level=args.log_level.lower(), lifespan="on"))
    front.server = server
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    return 0 if server.started else 1


if __name__ == "__main__":
    sys.exit(main())
