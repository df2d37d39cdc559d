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
Not yet: a commentary message addressed to a function (`to=functions.NAME`) is a tool call in
harmony; it is returned as content, not as `tool_calls`.
"""
from __future__ import annotations

from .text import TextStream

REASONING = ("analysis",)


class ChannelText:
    """TextStream's interface (`push`, `flush`), plus `take_reasoning()` for the analysis text."""

    def __init__(self, tokenizer, stops: list[str]):
        self.tok, self.stops = tokenizer, stops
        self.start, self.message = tokenizer.token_id("<|start|>"), tokenizer.token_id("<|message|>")
        self.ends = {tokenizer.token_id(t) for t in ("<|end|>", "<|return|>", "<|call|>")} - {None}
        self.header: list[int] = []          # header ids since the last <|start|>
        self.body: TextStream | None = None   # the message body being read, None in a header
        self.reasoning = False
        self._thought = ""

    def push(self, token: int) -> tuple[str, bool]:
        """(content text safe to emit, whether a stop string ended the generation)."""
        if self.body is None:
            if token == self.message:
                channel = self._channel(self.tok.decode(self.header))
                self.reasoning = channel in REASONING
                self.body = TextStream(self.tok, [] if self.reasoning else self.stops)
                self.header = []
            elif token == self.start:
                self.header = []
            else:
                self.header.append(token)
            return "", False
        if token in self.ends:
            tail = self.body.flush()
            self.body = None
            return self._route(tail, False)
        return self._route(*self.body.push(token))

    def flush(self) -> str:
        if self.body is None:
            return ""
        text, _ = self._route(self.body.flush(), False)
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
    def _channel(header: str) -> str:
        """`assistant<|channel|>final to=x <|constrain|>json` -> "final" ("" when none)."""
        _, sep, rest = header.partition("<|channel|>")
        if not sep:
            return ""
        words = rest.replace("<|constrain|>", " ").split()
        return words[0] if words else ""
