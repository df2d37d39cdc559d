"""Turning logits into a token: greedy, temperature, top-k, top-p.

Owns: `SamplingParams` (validated, frozen) and `sample`, plus `probs` (the
distribution `sample` draws from -- speculative sampling needs it).  Does not
own: the generation loop or stop conditions (generate.py).

Greedy (temperature 0) is `argmax`, ties broken towards the lower id.
top-k uses `torch.topk`, never a full sort of the vocabulary; top-p sorts only
what top-k left (or the whole vocabulary when top-k is off).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import RequestError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0                    # 0 = off
    seed: int | None = None

    def __post_init__(self):
        if not (0.0 <= self.temperature <= 100.0):
            raise RequestError(f"temperature must be in [0, 100], got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise RequestError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise RequestError(f"top_k must be >= 0, got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    def generator(self) -> torch.Generator:
        g = torch.Generator()
        g.manual_seed(self.seed if self.seed is not None else torch.seed())
        return g


def probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The sampling distribution over the vocabulary, float32 [vocab] (dense)."""
    logits = logits.float()
    if params.greedy:
        out = torch.zeros_like(logits)
        out[int(torch.argmax(logits))] = 1.0
        return out
    scaled = logits / params.temperature
    if params.top_k and params.top_k < scaled.numel():
        vals, idx = torch.topk(scaled, params.top_k)
    else:
        vals, idx = torch.sort(scaled, descending=True)
    if bool(torch.isposinf(vals[0])):
        # a logit past float32's range once divided by a temperature below 1 (the server maps
        # +inf to float32's max): the softmax would be inf - inf = NaN; such tokens win outright
        hot = torch.isposinf(vals).float()
        p = hot / hot.sum()
    else:
        p = torch.softmax(vals, dim=-1)
    if params.top_p < 1.0:
        keep = torch.cumsum(p, dim=-1) - p < params.top_p     # always keeps the first
        p = torch.where(keep, p, torch.zeros_like(p))
        p = p / p.sum()
    out = torch.zeros_like(logits)
    out[idx] = p
    return out


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> int:
    if params.greedy:
        return int(torch.argmax(logits))
    p = probs(logits, params)
    return int(torch.multinomial(p.cpu(), 1, generator=generator))
