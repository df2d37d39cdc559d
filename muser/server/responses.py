"""Shaping a job's events into OpenAI responses: a JSON body or an SSE stream.

Owns: `ClientWatch` (the one listener on a request's ASGI receive channel,
which notices a client that left), `SSEResponse` (text/event-stream ending in
`data: [DONE]`, which cancels its job however the stream ends) and
`Formatter` (events -> chat / completion bodies and chunks for n choices, with
logprobs, tool calls (tools.py), echo, usage with cached_tokens, the `muser`
extension field, per-request metrics).
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
from .logprobs import chat_entries, completion_logprobs
from .scheduler import Job
from .tools import ToolStream, parse_calls


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


def merge_deltas(delta: list, events: asyncio.Queue) -> tuple[list, tuple | None]:
    """A lagging stream's catch-up: `delta` ([index, text, picks]) joined by the deltas of the
    same choice already waiting in `events`, as one chunk -- a client that reads slower than
    the model writes gets fewer, larger chunks (as vLLM's output collector merges them), not a
    backlog of one JSON write per token.  Returns (the merged delta, the first event that did
    not join: it is the stream's next).  Text and picks concatenate, so the chunk's text and
    its logprobs entries are those of the tokens it carries, in order; a reasoning or end
    event, or another choice's delta, stops the merge (choices' chunks keep their order)."""
    i, text, picks = delta
    parts, merged = [text], None
    while not events.empty():
        ev = events.get_nowait()
        if ev[0] != "delta" or ev[1] != i:
            return [i, "".join(parts), picks if merged is None else merged], ev
        parts.append(ev[2])
        if ev[3]:
            merged = (list(picks) if merged is None else merged) + list(ev[3])
    return [i, "".join(parts), picks if merged is None else merged], None


class Formatter:
    """Turns a job's events into OpenAI chat / completion bodies and chunks."""

    def __init__(self, state, req, chat: bool, t0: float, tools=None, echo: str = ""):
        self.state, self.req, self.chat, self.t0 = state, req, chat, t0
        self.rid = schemas.new_id("chatcmpl" if chat else "cmpl")
        self.model = state.model_id
        self.info: dict = {}
        self.tools = tools if tools is not None and tools.active else None
        self.echo = echo                       # completions: the prompt text to prepend
        self.prompt_picks: list = []

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

    # ------------------------------------------------------------------ shapes
    def _logprobs(self, picks, offset: int = 0):
        if self.chat:
            return {"content": chat_entries(self.state.token_text, picks), "refusal": None}
        return completion_logprobs(self.state.token_text, picks, offset)

    @property
    def _wants_logprobs(self) -> bool:
        return bool(self.req.logprobs) if self.chat else self.req.logprobs is not None

    def _choice(self, index: int, text: str, finish: str, picks, reasoning: str = "") -> dict:
        lp = None
        if self._wants_logprobs:
            if self.chat:
                lp = self._logprobs(picks)
            else:
                head = self._logprobs(self.prompt_picks) if self.prompt_picks else None
                tail = self._logprobs(picks, len(self.echo))
                lp = tail if head is None else {k: head[k] + tail[k] for k in tail}
        if not self.chat:
            return {"index": index, "text": self.echo + text, "finish_reason": finish, "logprobs": lp}
        msg = {"role": "assistant", "content": text}
        if self.tools is not None:
            content, calls = parse_calls(text, self.tools, truncated=finish == "length")
            if calls:
                msg = {"role": "assistant", "content": content,
                       "tool_calls": [{"id": f"call_{self.rid[-12:]}_{index}_{i}", "type": "function",
                                       "function": c} for i, c in enumerate(calls)]}
                finish = "tool_calls" if finish == "stop" else finish
        if reasoning:                         # a harmony model's analysis channel (channels.py)
            msg["reasoning_content"] = reasoning
        return {"index": index, "message": msg, "finish_reason": finish, "logprobs": lp}

    async def whole(self, job: Job, watch: ClientWatch) -> Response:
        n = job.decoding.n
        parts: list[list[str]] = [[] for _ in range(n)]
        picks: list[list] = [[] for _ in range(n)]
        thoughts: list[list[str]] = [[] for _ in range(n)]
        while True:
            ev = await self.next_event(job, watch)
            if ev is None or ev[0] == "error":
                return self.early_exit(ev)
            kind, *payload = ev
            if kind == "delta":
                i, text, ps = payload
                parts[i].append(text)
                picks[i] += ps
            elif kind == "reasoning":
                thoughts[payload[0]].append(payload[1])
            elif kind == "prompt":
                self.prompt_picks = payload[0]
            elif kind == "done":
                finishes, generated = payload
                if "cancelled" in finishes:
                    return self.early_exit(None)
                self._done("200")
                choices = [self._choice(i, "".join(parts[i]), finishes[i] if i < len(finishes)
                                        else finishes[0], picks[i], "".join(thoughts[i]))
                           for i in range(n)]
                build = schemas.chat_response if self.chat else schemas.completion_response
                return JSONResponse(build(self.rid, self.model, choices, self._usage(generated),
                                          self._ext()))

    def _echo_chunk(self, index: int, first: bool) -> dict:
        head = self._logprobs(self.prompt_picks) if self.prompt_picks and self._wants_logprobs else None
        return schemas.completion_chunk(self.rid, self.model, self.echo, None, index=index,
                                        logprobs=head, ext=self._ext() if first else None)

    async def stream(self, job: Job) -> AsyncIterator[dict]:
        n = job.decoding.n
        tools = [ToolStream(self.tools) if self.tools is not None else None for _ in range(n)]
        called = [False] * n
        offsets = [len(self.echo)] * n
        echoed = [False] * n
        if self.chat:
            for i in range(n):
                yield schemas.chat_chunk(self.rid, self.model, {"role": "assistant", "content": ""},
                                         None, ext=self._ext() if i == 0 else None, index=i)
        first = not self.chat
        held = None                                # an event taken while merging deltas
        while True:
            if held is None:
                kind, *payload = await job.events.get()
            else:
                (kind, *payload), held = held, None
            if kind == "delta":
                payload, held = merge_deltas(payload, job.events)
            if kind == "prompt":
                self.prompt_picks = payload[0]
            elif kind == "reasoning":             # only a chat's (channels.py)
                i, text = payload
                yield schemas.chat_chunk(self.rid, self.model, {"reasoning_content": text}, None,
                                         index=i)
            elif kind == "delta":
                i, text, ps = payload
                lp = self._logprobs(ps, offsets[i]) if self._wants_logprobs and ps else None
                if self.chat:
                    deltas = tools[i].push(text) if tools[i] is not None else \
                        ([{"content": text}] if text or lp else [])
                    if not deltas and lp:
                        deltas = [{"content": ""}]
                    for k, d in enumerate(deltas):
                        yield schemas.chat_chunk(self.rid, self.model, d, None, index=i,
                                                 logprobs=lp if k == 0 else None)
                    continue
                if self.echo and not echoed[i]:
                    echoed[i] = True
                    yield self._echo_chunk(i, first)
                    first = False
                offsets[i] += len(text)
                yield schemas.completion_chunk(self.rid, self.model, text, None, index=i, logprobs=lp,
                                               ext=self._ext() if first else None)
                first = False
            elif kind == "end":
                i, finish = payload
                if self.chat and tools[i] is not None:
                    deltas, called[i] = tools[i].finish()
                    for d in deltas:
                        yield schemas.chat_chunk(self.rid, self.model, d, None, index=i)
                    if called[i] and finish == "stop":
                        finish = "tool_calls"
                if self.chat:
                    yield schemas.chat_chunk(self.rid, self.model, {}, finish, index=i,
                                             ext=self._ext() if i == 0 else None)
                else:
                    if self.echo and not echoed[i]:
                        echoed[i] = True
                        yield self._echo_chunk(i, first)
                        first = False
                    yield schemas.completion_chunk(self.rid, self.model, "", finish, index=i,
                                                   ext=self._ext() if first or i == 0 else None)
                    first = False
            elif kind == "error":
                err = to_http(payload[0])
                self._done(str(err.status))
                yield err.body()
                return
            elif kind == "done":
                finishes, generated = payload
                if "cancelled" in finishes:
                    self._done("disconnected")
                    self.state.metrics.inc("disconnects_total")
                    return
                self._done("200")
                if self.req.include_usage:
                    yield (schemas.chat_chunk if self.chat else schemas.completion_chunk)(
                        self.rid, self.model, {} if self.chat else "", None,
                        use=self._usage(generated), empty=True)
                return
