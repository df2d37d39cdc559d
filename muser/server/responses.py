"""Shaping a job's events into OpenAI responses: a JSON body or an SSE stream.

Owns: `ClientWatch` (the one listener on a request's ASGI receive channel,
which notices a client that left) and `Formatter` (events -> chat / completion
bodies and chunks for n choices, with logprobs, tool calls (tools.py), echo,
usage with cached_tokens, the `muser` extension field, per-request metrics).
Does not own: producing events (scheduler.py), leasing (service.py), the SSE
framing (sse.py: the response, pushed or from the queue, text frames from a template),
a stream's per-event chunking (moved to stream_shape.py: `StreamShape`, which
`Formatter.shaper` returns) or the bodies' dict shapes (moved to bodies.py).
"""
from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from . import bodies
from .http_errors import to_http
from .logprobs import chat_entries, completion_logprobs
from .scheduler import Job
from .sse import TextFrames
from .stream_shape import StreamShape
from .tools import parse_calls


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


class Formatter:
    """Turns a job's events into OpenAI chat / completion bodies and chunks."""

    def __init__(self, state, req, chat: bool, t0: float, tools=None, echo: str = ""):
        self.state, self.req, self.chat, self.t0 = state, req, chat, t0
        self.rid = bodies.new_id("chatcmpl" if chat else "cmpl")
        self.model = state.model_id
        self.info: dict = {}
        self.tools = tools if tools is not None and tools.active else None
        self.echo = echo                       # completions: the prompt text to prepend
        self.prompt_picks: list = []
        self.created = int(time.time())        # every chunk of the stream carries it
        self._frames: dict[int, TextFrames] = {}   # choice -> its plain text chunks' template

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
        return bodies.usage(self.info["prompt_tokens"], generated, self.info["cached_tokens"])

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
                build = bodies.chat_response if self.chat else bodies.completion_response
                return JSONResponse(build(self.rid, self.model, choices, self._usage(generated),
                                          self._ext()))

    def _chat_chunk(self, delta: dict, finish, **kw) -> dict:
        return bodies.chat_chunk(self.rid, self.model, delta, finish, created=self.created, **kw)

    def _completion_chunk(self, text: str, finish, **kw) -> dict:
        return bodies.completion_chunk(self.rid, self.model, text, finish, created=self.created,
                                       **kw)

    def _text_frame(self, i: int, text: str) -> bytes:
        """Choice i's plain text chunk (no logprobs, no finish, no extension field) as an SSE
        frame: the chunk's JSON is made once a choice (sse.TextFrames)."""
        frames = self._frames.get(i)
        if frames is None:
            make = (lambda t: self._chat_chunk({"content": t}, None, index=i, logprobs=None)) \
                if self.chat else (lambda t: self._completion_chunk(t, None, index=i, logprobs=None))
            frames = self._frames[i] = TextFrames(make)
        return frames(text)

    def _echo_chunk(self, index: int, first: bool) -> dict:
        head = self._logprobs(self.prompt_picks) if self.prompt_picks and self._wants_logprobs else None
        return self._completion_chunk(self.echo, None, index=index, logprobs=head,
                                      ext=self._ext() if first else None)

    def shaper(self, job: Job) -> "StreamShape":
        """A stream's chunks, one event at a time (its state: tool parsers, offsets, echo)."""
        return StreamShape(self, job.decoding.n)

    async def stream(self, job: Job) -> AsyncIterator[dict | bytes]:
        """The stream's chunks from the job's queue: one chunk a delta, as the worker sent it
        (every token, or every --stream-interval tokens), however far the reader lags -- so
        chunk boundaries do not depend on timing, and equal the pushed stream's."""
        shape = self.shaper(job)
        for chunk in shape.opening():
            yield chunk
        while True:
            chunks, end = shape.feed(await job.events.get())
            for chunk in chunks:
                yield chunk
            if end:
                return
