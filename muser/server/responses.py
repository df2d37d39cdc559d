"""Shaping a job's events into OpenAI responses: a JSON body or an SSE stream.

Owns: `ClientWatch` (the one listener on a request's ASGI receive channel,
which notices a client that left), `SSEResponse` (text/event-stream ending in
`data: [DONE]`, which cancels its job however the stream ends) and
`Formatter` (events -> chat / completion bodies and chunks, usage with
cached_tokens, the `muser` extension field, per-request metrics).
Does not own: producing events (scheduler.py) or leasing (service.py).
"""
from __future__ import annotations

import asyncio
import json
import time
from typing import AsyncIterator, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from . import schemas
from .http_errors import to_http
from .scheduler import Job


class ClientWatch:
    """One listener on the ASGI receive channel: sets `gone` when the client disconnects."""

    def __init__(self, request: Request):
        self.gone = asyncio.Event()
        self.on_gone: list[Callable[[], None]] = []
        self._task = asyncio.create_task(self._listen(request.receive))

    async def _listen(self, receive) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                self.gone.set()
                for f in self.on_gone:
                    f()
                return

    def close(self) -> None:
        self._task.cancel()


class SSEResponse(Response):
    """text/event-stream from an async iterator of dicts; ends with `data: [DONE]`."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[dict], finalize: Callable[[], None]):
        self.status_code, self.background = 200, None
        self.raw_headers = [(b"content-type", b"text/event-stream; charset=utf-8"),
                            (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
        self.events, self.finalize = events, finalize

    async def __call__(self, scope, receive, send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for ev in self.events:
                data = f"data: {json.dumps(ev, ensure_ascii=False)}\n\n".encode()
                await send({"type": "http.response.body", "body": data, "more_body": True})
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n",
                        "more_body": False})
        except OSError:
            pass
        finally:
            self.finalize()


class Formatter:
    """Turns a job's events into OpenAI chat / completion bodies and chunks."""

    def __init__(self, state, req, chat: bool, t0: float):
        self.state, self.req, self.chat, self.t0 = state, req, chat, t0
        self.rid = schemas.new_id("chatcmpl" if chat else "cmpl")
        self.model = state.model_id
        self.info: dict = {}

    def _ext(self) -> dict:
        i = self.info
        plan = i.get("plan")
        ext = {"slot": i.get("slot"), "context_epoch": i.get("context_epoch"),
               "shifted": i.get("shifted", False)}
        if self.chat and self.state.base_model_note:
            ext["warning"] = self.state.base_model_note
        if self.state.config.replica is not None:
            ext["replica"] = self.state.config.replica
        if plan is not None:
            if hasattr(plan, "dropped_turns"):
                ext["dropped_turns"] = plan.dropped_turns
            else:
                ext["dropped_tokens"] = plan.dropped
            ext["plan"] = plan.reason
        return ext

    def _usage(self, generated: int) -> dict:
        return schemas.usage(self.info["prompt_tokens"], generated, self.info["cached_tokens"])

    def start(self, info: dict, job: Job) -> None:
        self.info = dict(info, plan=job.placement.plan)
        m = self.state.metrics
        m.observe("ttft_seconds", time.perf_counter() - self.t0)
        m.inc("prompt_tokens_total", info["prompt_tokens"])
        m.inc("cached_tokens_total", info["cached_tokens"])
        if info["cached_tokens"]:
            m.inc("cache_hits_total")

    def _done(self, status: str) -> None:
        self.state.metrics.inc("requests_total", labels={
            "endpoint": "chat" if self.chat else "completions", "status": status})

    async def next_event(self, job: Job, watch: ClientWatch):
        """The job's next event, or None when the client left first."""
        get = asyncio.ensure_future(job.events.get())
        gone = asyncio.ensure_future(watch.gone.wait())
        await asyncio.wait({get, gone}, return_when=asyncio.FIRST_COMPLETED)
        gone.cancel()
        if get.done():
            return get.result()
        get.cancel()
        return None

    def early_exit(self, event) -> Response:
        if event is None:
            self.state.metrics.inc("disconnects_total")
            self._done("disconnected")
            return Response(status_code=499)
        if event[0] == "error":
            err = to_http(event[1])
        else:                                   # "done" before "start": cancelled
            err = to_http(RuntimeError(f"unexpected event {event[0]!r}"))
        self._done(str(err.status))
        return JSONResponse(err.body(), status_code=err.status)

    async def whole(self, job: Job, watch: ClientWatch) -> Response:
        parts: list[str] = []
        while True:
            ev = await self.next_event(job, watch)
            if ev is None or ev[0] == "error":
                return self.early_exit(ev)
            kind, *payload = ev
            if kind == "delta":
                parts.append(payload[0])
            elif kind == "done":
                finish, generated = payload
                if finish == "cancelled":
                    return self.early_exit(None)
                self._done("200")
                build = schemas.chat_response if self.chat else schemas.completion_response
                return JSONResponse(build(self.rid, self.model, "".join(parts), finish,
                                          self._usage(generated), self._ext()))

    async def stream(self, job: Job) -> AsyncIterator[dict]:
        chunk = schemas.chat_chunk if self.chat else schemas.completion_chunk
        if self.chat:
            yield chunk(self.rid, self.model, {"role": "assistant", "content": ""}, None,
                        ext=self._ext())
        first = not self.chat
        while True:
            kind, *payload = await job.events.get()
            if kind == "delta":
                if self.chat:
                    yield chunk(self.rid, self.model, {"content": payload[0]}, None)
                else:
                    yield chunk(self.rid, self.model, payload[0], None,
                                ext=self._ext() if first else None)
                    first = False
            elif kind == "error":
                err = to_http(payload[0])
                self._done(str(err.status))
                yield err.body()
                return
            elif kind == "done":
                finish, generated = payload
                if finish == "cancelled":
                    self._done("disconnected")
                    self.state.metrics.inc("disconnects_total")
                    return
                self._done("200")
                yield chunk(self.rid, self.model, {} if self.chat else "", finish, ext=self._ext())
                if self.req.include_usage:
                    yield chunk(self.rid, self.model, {} if self.chat else "", None,
                                use=self._usage(generated), empty=True)
                return
