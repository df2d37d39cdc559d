"""Logit controls a request adds on top of the model's logits, before any sampling.

Owns: `Controls` (frequency / presence / repetition penalties, logit_bias,
min_p, validated and frozen) and `History` (the token counts the penalties
read, with an undo for speculative blocks).  Does not own: the grammar mask
(constrained.py), temperature / top-k / top-p (sampling.py) or logprobs
(picker.py).

Semantics (as OpenAI and vLLM define them):
  frequency_penalty f, presence_penalty p  (generated tokens only):
      score[t] -= f * count[t] + p * (count[t] > 0)
  repetition_penalty r  (prompt and generated tokens, the CTRL / transformers rule):
      score[t] = score[t] / r if score[t] > 0 else score[t] * r
  logit_bias {id: b}, b in [-100, 100]:  score[id] += b
  min_p m  (after temperature T): drop t where prob[t] < m * max prob, i.e.
      score[t] < max score + T * ln(m)      (applied by `truncate_min_p`)
  min_tokens k with ids E (vLLM's): while fewer than k tokens are generated, score[e] = -inf
      for e in E (the server passes the ids that would end the output: end-of-sequence,
      stop_token_ids, a chat's turn markers) -- so at least k tokens come out
All are applied sparsely: only the ids that were seen or biased are touched,
never a pass over the whole vocabulary.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..errors import ParameterError

MAX_BIAS_ENTRIES = 1024


@dataclass(frozen=True)
class Controls:
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_p: float = 0.0
    min_tokens: int = 0                            # the ids below are refused before this many
    min_tokens_ids: tuple[int, ...] = ()           # tokens are generated (History.order)

    def __post_init__(self):
        for name, lo, hi in (("frequency_penalty", -2.0, 2.0), ("presence_penalty", -2.0, 2.0),
                             ("min_p", 0.0, 1.0)):
            v = getattr(self, name)
            if not (lo <= v <= hi):
                raise ParameterError(name, f"must be in [{lo}, {hi}], got {v}")
        if not (0.0 < self.repetition_penalty <= 10.0):
            raise ParameterError("repetition_penalty", f"must be in (0, 10], got {self.repetition_penalty}")
        if self.min_tokens < 0:
            raise ParameterError("min_tokens", f"must be >= 0, got {self.min_tokens}")
        if len(self.logit_bias) > MAX_BIAS_ENTRIES:
            raise ParameterError("logit_bias", f"at most {MAX_BIAS_ENTRIES} entries, got {len(self.logit_bias)}")
        for tok, b in self.logit_bias:
            if not (-100.0 <= b <= 100.0) or math.isnan(b):
                raise ParameterError(f"logit_bias.{tok}", f"bias must be in [-100, 100], got {b}")

    @staticmethod
    def bias_from(raw: dict | None, vocab_size: int) -> tuple[tuple[int, float], ...]:
        """OpenAI's `logit_bias` (string token ids -> bias) checked against the vocabulary."""
        if not raw:
            return ()
        out = []
        for key, b in raw.items():
            try:
                tok = int(key)
            except (TypeError, ValueError):
                raise ParameterError("logit_bias", f"keys must be token ids (integers as strings), "
                                                   f"got {str(key)[:40]!r}") from None
            if not 0 <= tok < vocab_size:
                raise ParameterError("logit_bias", f"token id {tok} is outside the vocabulary "
                                                   f"[0, {vocab_size})")
            if isinstance(b, bool) or not isinstance(b, (int, float)):
                raise ParameterError(f"logit_bias.{key}", f"bias must be a number, got {type(b).__name__}")
            out.append((tok, float(b)))
        return tuple(sorted(out))

    @property
    def active(self) -> bool:
        return bool(self.frequency_penalty or self.presence_penalty or self.logit_bias
                    or self.repetition_penalty != 1.0 or (self.min_tokens and self.min_tokens_ids))


@dataclass
class History:
    """Counts of generated tokens (penalties) and the set of prompt tokens (repetition)."""

    prompt: frozenset = frozenset()
    counts: dict = field(default_factory=dict)        # token id -> times generated
    order: list = field(default_factory=list)         # generated ids, for undo

    def add(self, token: int) -> None:
        self.counts[token] = self.counts.get(token, 0) + 1
        self.order.append(token)

    def undo(self, n: int) -> None:
        for _ in range(n):
            t = self.order.pop()
            c = self.counts[t] - 1
            if c:
                self.counts[t] = c
            else:
                del self.counts[t]

    def copy(self) -> "History":
        return History(self.prompt, dict(self.counts), list(self.order))


def apply_controls(scores: torch.Tensor, c: Controls, h: History) -> torch.Tensor:
    """Penalties and bias on float32 `scores` [vocab], in place; returns `scores`."""
    if c.repetition_penalty != 1.0:
        seen = h.prompt.union(h.counts) if h.counts else h.prompt
        if seen:
            idx = torch.tensor(sorted(seen), dtype=torch.long)
            v = scores[idx]
            scores[idx] = torch.where(v > 0, v / c.repetition_penalty, v * c.repetition_penalty)
    if (c.frequency_penalty or c.presence_penalty) and h.counts:
        idx = torch.tensor(list(h.counts), dtype=torch.long)
        cnt = torch.tensor(list(h.counts.values()), dtype=torch.float32)
        scores[idx] -= c.frequency_penalty * cnt + c.presence_penalty
    if c.logit_bias:
        idx = torch.tensor([t for t, _ in c.logit_bias], dtype=torch.long)
        scores[idx] += torch.tensor([b for _, b in c.logit_bias], dtype=torch.float32)
    if c.min_tokens_ids and len(h.order) < c.min_tokens:     # last: no bias brings them back
        scores[torch.tensor(c.min_tokens_ids, dtype=torch.long)] = float("-inf")
    return scores


def truncate_min_p(scores: torch.Tensor, min_p: float, temperature: float) -> torch.Tensor:
    """Tokens whose probability at `temperature` is below min_p x the top one -> -inf (in place)."""
    if min_p <= 0.0 or temperature <= 0.0:
        return scores
    top = float(scores.max())
    return scores.masked_fill_(scores < top + temperature * math.log(min_p), float("-inf"))
