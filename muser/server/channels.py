"""A harmony reply split into its channels: reasoning apart from the answer (gpt-oss).

Owns: `ChannelText`, the chat text stream for a model whose template speaks harmony.
Does not own: plain text streaming and stop strings (text.TextStream, which it runs once per
message body), the end of generation (<|return|> and <|call|> are end-of-sequence ids, see
model/tokenizer.py) or how deltas become JSON (responses.py).

A harmony reply, after the template's generation prompt `<|start|>assistant`:

    <|channel|>analysis<|message|>Let me think...<|end|>
    <|start|>assistant<|channel|>final<|message|>The answer is 4.<|return|>
    '------- header -------------'  '--- body --------'

Header tokens (role, channel, recipient `to=...`, `<|constrain|>json`) are read up to
<|message|>; the body runs to <|end|> (another message follows), <|return|> or <|call|>.  A body
on the `analysis` channel is reasoning (`reasoning_content`, as vLLM names it); `final` and
`commentary` are content.  Without the split a client reads "analysisLet me
think...assistantfinalThe answer is 4." as the answer.  Stop strings apply to the content.
A message addressed to a function (`commentary to=functions.NAME <|constrain|>json`, ended by
<|call|>) is a tool call: when the request offered tools it is written out in the server's one
tool-call text format (tools.py: a `<tool_call>` block), so the same parser and stream turn it
into `tool_calls`.
"""
from __future__ import annotations

import json

from .text import TextStream
from .tools import CLOSE, OPEN

REASONING = ("analysis",)
FUNCTIONS = "functions."
MAX_HEADER = 64         # header tokens before a reply that never opens a message is read as content


class ChannelText:
    """TextStream's interface (`push`, `flush`), plus `take_reasoning()` for the analysis text."""

    def __init__(self, tokenizer, stops: list[str], tool_calls: bool = False):
        self.tok, self.stops = tokenizer, stops
        self.start, self.message = tokenizer.token_id("<|start|>"), tokenizer.token_id("<|message|>")
        self.ends = {tokenizer.token_id(t) for t in ("<|end|>", "<|return|>", "<|call|>")} - {None}
        self.header: list[int] = []          # header ids since the last <|start|>
        self.body: TextStream | None = None   # the message body being read, None in a header
        self.reasoning = False
        self.call = False                     # the body is a function's JSON arguments
        self.tool_calls = tool_calls          # the request offered tools
        self._thought = ""

    def push(self, token: int) -> tuple[str, bool]:
        """(content text safe to emit, whether a stop string ended the generation)."""
        if self.body is None:
            if token == self.message:
                header = self.tok.decode(self.header)
                self.header = []
                channel, name = self._channel(header), self._function(header)
                self.reasoning = channel in REASONING
                self.call = self.tool_calls and name is not None and not self.reasoning
                self.body = TextStream(self.tok, [] if self.reasoning or self.call else self.stops)
                if self.call:
                    return f"{OPEN}{{\"name\": {json.dumps(name)}, \"arguments\": ", False
            elif token == self.start:
                self.header = []
            else:
                self.header.append(token)
                if len(self.header) > MAX_HEADER:
                    # not harmony after all (a model that ignores its template): plain content
                    ids, self.header = self.header, []
                    self.reasoning = self.call = False
                    self.body = TextStream(self.tok, self.stops)
                    out, stopped = "", False
                    for t in ids:
                        piece, stopped = self.body.push(t)
                        out += piece
                        if stopped:
                            break
                    return out, stopped
            return "", False
        if token in self.ends:
            return self._close(), False
        return self._route(*self.body.push(token))

    def flush(self) -> str:
        """The rest of the open message (<|call|> and <|return|> end generation before push)."""
        return "" if self.body is None else self._close()

    def _close(self) -> str:
        text, _ = self._route(self.body.flush(), False)
        if self.call:
            text += "}" + CLOSE + "\n"
        self.body, self.call = None, False
        return text

    def take_reasoning(self) -> str:
        out, self._thought = self._thought, ""
        return out

    def _route(self, text: str, stopped: bool) -> tuple[str, bool]:
        if self.reasoning:
            self._thought += text
            return "", False
        return text, stopped

    @staticmethod
    def _function(header: str) -> str | None:
        """`... to=functions.get_weather <|constrain|>json` -> "get_weather" (None: no function)."""
        for word in header.replace("<|", " <|").split():
            if word.startswith("to=" + FUNCTIONS) and len(word) > len("to=" + FUNCTIONS):
                return word[len("to=" + FUNCTIONS):]
        return None

    @staticmethod
    def _channel(header: str) -> str:
        """`assistant<|channel|>final to=x <|constrain|>json` -> "final" ("" when none)."""
        _, sep, rest = header.partition("<|channel|>")
        if not sep:
            return ""
        words = rest.replace("<|constrain|>", " ").split()
        return words[0] if words else ""
