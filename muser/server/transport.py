"""What reaches the app from a socket: bounded request heads and bodies, and client aborts.

Owns: `read_body` (a body is counted as it arrives -- chunked or not -- and
refused with 413 the moment it passes the limit, so nothing past the limit
is ever buffered; 408 when it does not arrive within the body timeout; a
client that leaves mid-upload is `ClientGone`, a quiet counted disconnect),
the uvicorn protocol guard (`guarded_protocol`: a connection whose request
head is not complete within `header_timeout` seconds, or grows past
`max_header_bytes`, is closed -- uvicorn itself only times out idle
keep-alive connections, so a half-sent head would hold a connection forever)
`check_bearer` (the API key gate, for the server and the replicas' ingress alike) and
`uvicorn_config`, the one place `muser serve` and the tests build uvicorn's settings.
Does not own: what a body means (schemas.py, app.py) or error shapes
(http_errors.py).
"""
from __future__ import annotations

import asyncio
import hmac
import logging

from starlette.requests import ClientDisconnect, Request

from .http_errors import AuthError, ClientGone, PayloadTooLarge, RequestTimeout

log = logging.getLogger("muser.server")


def check_bearer(request: Request, key: str | None) -> None:
    """AuthError unless the request carries `Authorization: Bearer <key>` (no key: open)."""
    if key is None:
        return
    header = request.headers.get("authorization", "")
    if not header:
        raise AuthError("missing API key: send 'Authorization: Bearer <key>'")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
        raise AuthError("incorrect API key provided")


async def read_body(request: Request, limit: int, timeout: float) -> bytes:
    """The whole body, at most `limit` bytes, received within `timeout` seconds."""
    n = request.headers.get("content-length")
    if n is not None and n.strip().isdigit() and int(n) > limit:
        raise PayloadTooLarge(f"request body of {int(n):,} bytes exceeds the limit of "
                              f"{limit:,} bytes")
    parts: list[bytes] = []
    size = 0

    async def collect() -> None:
        nonlocal size
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"request body exceeds the limit of {limit:,} bytes")
            parts.append(chunk)
    try:
        await asyncio.wait_for(collect(), timeout)
    except ClientDisconnect:
        raise ClientGone("the client disconnected while sending its request") from None
    except asyncio.TimeoutError:
        raise RequestTimeout(f"the request body was not received within {timeout:g} s "
                             f"({size:,} bytes arrived)") from None
    return b"".join(parts)


class _HeadGuard:
    """Mixin over a uvicorn HTTP protocol: close connections whose request head stalls.

    A "head phase" starts when the connection is made and again whenever a
    response completes (keep-alive); it ends when a request's head is parsed
    (the protocol creates a new request cycle).  If the phase is still open
    `head_timeout` seconds after it began, or more than `max_head_bytes`
    arrived during it, the connection is closed.  A request in flight (a
    long stream) is never affected: the check only fires with no cycle running.
    """

    head_timeout = 10.0
    max_head_bytes = 64 << 10

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._head_phase = 0
        self._head_bytes = 0
        self._start_head_phase()

    def _start_head_phase(self) -> None:
        self._head_phase += 1
        self._head_bytes = 0
        self.loop.call_later(self.head_timeout, self._head_deadline, self._head_phase)

    def _waiting_for_head(self) -> bool:
        cycle = self.cycle
        return cycle is None or cycle.response_complete

    def _head_deadline(self, phase: int) -> None:
        transport = getattr(self, "transport", None)
        if phase != self._head_phase or transport is None or transport.is_closing():
            return
        if self._waiting_for_head():
            log.info("closing a connection from %s: no complete request head within %g s",
                     _peer(self), self.head_timeout)
            transport.close()

    def data_received(self, data: bytes) -> None:
        waiting = self._waiting_for_head()
        before = self.cycle
        super().data_received(data)
        if not waiting or self.transport.is_closing():
            return
        if self.cycle is not before:           # a head completed: the phase is over
            self._head_phase += 1
            return
        self._head_bytes += len(data)
        if self._head_bytes > self.max_head_bytes:
            log.info("closing a connection from %s: request head over %d bytes",
                     _peer(self), self.max_head_bytes)
            self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
                                 b"content-length: 0\r\nconnection: close\r\n\r\n")
            self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._start_head_phase()


def _peer(proto) -> str:
    client = getattr(proto, "client", None)
    return f"{client[0]}:{client[1]}" if client else "?"


def guarded_protocol(head_timeout: float, max_head_bytes: int):
    """uvicorn's default HTTP protocol class with the head guard mixed in."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol
    return type("GuardedHTTPProtocol", (_HeadGuard, AutoHTTPProtocol),
                {"head_timeout": float(head_timeout), "max_head_bytes": int(max_head_bytes)})


def uvicorn_config(app, config, **kw):
    """uvicorn.Config for `app` under ServerConfig `config` (extra uvicorn settings in kw)."""
    import uvicorn
    kw.setdefault("timeout_graceful_shutdown", 5)
    kw.setdefault("timeout_keep_alive", 5)
    # limit_concurrency: past this many open connections (or running requests) uvicorn answers
    # 503 at once instead of accepting more -- a client that opens thousands of idle sockets
    # cannot exhaust the process's descriptors or memory
    kw.setdefault("limit_concurrency", config.max_connections)
    return uvicorn.Config(app, http=guarded_protocol(config.header_timeout, config.max_header_bytes),
                          h11_max_incomplete_event_size=config.max_header_bytes, **kw)
