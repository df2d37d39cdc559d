"""A stream's chunks, one event at a time: `StreamShape`.

Owns: turning one streamed request's events into its chunks (dicts, or SSE
frames already encoded) -- the chat opening chunks, text / reasoning / tool-call
deltas, completions echo, finish chunks and the closing usage chunk -- with the
per-choice state that takes (tool parsers, logprob offsets, echo sent).  Both
the queue-driven `Formatter.stream` and the pushed stream use it, so both send
the same chunks.  Does not own: the request's identity, extension field,
logprobs and chunk builders (responses.py, `Formatter`), the bodies' dict shapes
(bodies.py) or the SSE response itself (sse.py).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .http_errors import to_http
from .tools import ToolStream

if TYPE_CHECKING:
    from .responses import Formatter


class StreamShape:
    """One stream's events -> its chunks (dicts, or frames already encoded), synchronously: the
    queue-driven `Formatter.stream` and the pushed stream (sse.SSEResponse with a sync sender,
    the --front-process engine side) share it, so both send the same chunks."""

    def __init__(self, fmt: Formatter, n: int):
        self.fmt, self.n = fmt, n
        self.tools = [ToolStream(fmt.tools) if fmt.tools is not None else None for _ in range(n)]
        self.called = [False] * n
        self.offsets = [len(fmt.echo)] * n
        self.echoed = [False] * n
        self.first = not fmt.chat

    def opening(self) -> list:
        f = self.fmt
        if not f.chat:
            return []
        return [f._chat_chunk({"role": "assistant", "content": ""}, None,
                              ext=f._ext() if i == 0 else None, index=i) for i in range(self.n)]

    def feed(self, ev: tuple) -> tuple[list, bool]:
        """(the chunks event `ev` makes, whether the stream ends with it)."""
        f, out = self.fmt, []
        kind, *payload = ev
        if kind == "prompt":
            f.prompt_picks = payload[0]
        elif kind == "reasoning":             # only a chat's (channels.py)
            i, text = payload
            out.append(f._chat_chunk({"reasoning_content": text}, None, index=i))
        elif kind == "delta":
            self._delta(out, *payload)
        elif kind == "end":
            self._end(out, *payload)
        elif kind == "error":
            err = to_http(payload[0])
            f._done(str(err.status))
            return [err.body()], True
        elif kind == "done":
            finishes, generated = payload
            if "cancelled" in finishes:
                f._done("disconnected")
                f.state.metrics.inc("disconnects_total")
                return out, True
            f._done("200")
            if f.req.include_usage:
                out.append((f._chat_chunk if f.chat else f._completion_chunk)(
                    {} if f.chat else "", None, use=f._usage(generated), empty=True))
            return out, True
        return out, False

    def _delta(self, out: list, i: int, text: str, ps) -> None:
        f = self.fmt
        lp = f._logprobs(ps, self.offsets[i]) if f._wants_logprobs and ps else None
        if f.chat and lp is None and self.tools[i] is None:
            if text:                          # the common chunk: text only
                out.append(f._text_frame(i, text))
            return
        if f.chat:
            deltas = self.tools[i].push(text) if self.tools[i] is not None else \
                ([{"content": text}] if text or lp else [])
            if not deltas and lp:
                deltas = [{"content": ""}]
            for k, d in enumerate(deltas):
                out.append(f._chat_chunk(d, None, index=i, logprobs=lp if k == 0 else None))
            return
        if f.echo and not self.echoed[i]:
            self.echoed[i] = True
            out.append(f._echo_chunk(i, self.first))
            self.first = False
        self.offsets[i] += len(text)
        if lp is None and not self.first:
            out.append(f._text_frame(i, text))
        else:
            out.append(f._completion_chunk(text, None, index=i, logprobs=lp,
                                           ext=f._ext() if self.first else None))
        self.first = False

    def _end(self, out: list, i: int, finish: str) -> None:
        f = self.fmt
        if f.chat and self.tools[i] is not None:
            deltas, self.called[i] = self.tools[i].finish()
            for d in deltas:
                out.append(f._chat_chunk(d, None, index=i))
            if self.called[i] and finish == "stop":
                finish = "tool_calls"
        if f.chat:
            out.append(f._chat_chunk({}, finish, index=i, ext=f._ext() if i == 0 else None))
            return
        if f.echo and not self.echoed[i]:
            self.echoed[i] = True
            out.append(f._echo_chunk(i, self.first))
            self.first = False
        out.append(f._completion_chunk("", finish, index=i,
                                       ext=f._ext() if self.first or i == 0 else None))
        self.first = False
