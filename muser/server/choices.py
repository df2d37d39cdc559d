"""What one request decodes: its n choices, each with a session, a picker and a text stream.

Owns: `Decoding` (everything a request asks of the token choice -- sampling, controls,
grammar, logprobs, n, stop token ids, prompt logprobs -- frozen, built by the
service from the validated request) and `Choice` (one of the n continuations: its
session, its `TokenPicker`, its text stream, the token it will feed next, its finish
reason), and `fork_sessions`: choices 1..n-1 start from choice 0's cut by snapshot
install -- the prompt is prefilled once.
Does not own: when model steps run (scheduler.py) or the response shapes (responses.py).

Seeds: choice i draws from a generator seeded with `seed + i`, so choice 0 of an n=3
request is the n=1 answer for the same seed and every choice is reproducible.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..engine.logits_processors import Controls
from ..engine.picker import Pick, TokenPicker
from ..engine.sampling import SamplingParams

PROMPT_LOGPROB_ROWS = 32     # prompt rows per forward when prompt logprobs are asked (memory)


@dataclass(frozen=True)
class Decoding:
    sampling: SamplingParams
    controls: Controls = Controls()
    grammar: Any = None                  # engine.constrained.Grammar | None
    logprobs: int | None = None          # None: off; else how many alternatives (0..20)
    n: int = 1
    stop_ids: frozenset = frozenset()
    prompt_logprobs: bool = False        # completions echo + logprobs
    channels: bool = False               # a harmony chat: reasoning apart (channels.ChannelText)
    tool_calls: bool = False             # the request offered tools (harmony calls become blocks)
    ignore_eos: bool = False             # the model's end-of-sequence ids (and a chat's turn
                                         # markers) do not end the output; stop_ids still do

    def generator(self, index: int) -> torch.Generator:
        g = torch.Generator()
        seed = self.sampling.seed
        if seed is None:
            g.seed()           # this generator's own entropy: torch.seed() would reseed every
        else:                  # device's global generator too (and format a stack on each call)
            g.manual_seed((seed + index) % (1 << 64))
        return g

    def picker(self, engine, index: int, prompt: list[int], constraint=None) -> TokenPicker:
        if constraint is None and self.grammar is not None:
            constraint = engine.grammars.constraint(self.grammar)
        return TokenPicker(self.sampling, self.controls, constraint, self.logprobs, prompt,
                           self.generator(index))


@dataclass(eq=False)
class Choice:
    index: int
    session: Any
    picker: TokenPicker
    text: Any                            # server.text.TextStream
    forked: bool = False                 # the session is the scheduler's, not the slot's
    pending: int | None = None           # sampled, fed at the next decode step (pipeline.py:
                                         # FromLast, the pick of the step in flight)
    ahead: int = 0                       # steps the session took past the pick being settled
    generated: int = 0
    done: bool = False
    finish: str | None = None
    picks: list[Pick] = field(default_factory=list)     # since the last delta (logprobs on)
    held: str = ""                       # text since the last delta (stream_interval > 1)
    unsent: int = 0                      # tokens settled since the last delta
    sent: bool = False                   # a delta went out (the first goes at once)
    draft_gate: Any = None               # engine.speculative.DraftGate, when the server speculates


def fork_sessions(engine, source, count: int, spare: list) -> list:
    """`count` sessions holding `source`'s cut (one snapshot, installed into each)."""
    if count <= 0:
        return []
    snap = source.snapshot()
    out = []
    for _ in range(count):
        s = spare.pop() if spare else engine.new_session()
        s.install(snap)
        out.append(s)
    return out


def prompt_logprob_rows(logits: torch.Tensor, ids: list[int], prev: torch.Tensor | None,
                        top: int) -> tuple[list[Pick], torch.Tensor]:
    """Picks (logprob + `top` alternatives) of `ids` from the rows that predicted them: `prev`
    (log-softmaxed row before the first id; None at the start of the prompt: no logprob) and
    `logits` [len(ids), vocab] (row j predicts id j+1).  Returns (picks, the last row)."""
    rows = torch.log_softmax(logits.float(), dim=-1)
    out: list[Pick] = []
    for j, t in enumerate(ids):
        row = prev if j == 0 else rows[j - 1]
        if row is None:
            out.append(Pick(int(t)))
            continue
        alts = ()
        if top:
            vals, idx = torch.topk(row, top)
            alts = tuple((int(i), float(v)) for v, i in zip(vals.tolist(), idx.tolist()))
        out.append(Pick(int(t), float(row[t]), alts))
    return out, rows[-1]
