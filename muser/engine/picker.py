"""Choosing one generation's next token: controls, grammar, sampling, logprobs, speculation.

Owns: `TokenPicker` -- per generation, the pipeline
    model logits (float32) -> controls (penalties, logit_bias) -> grammar mask  = scores
    scores -> min_p -> temperature / top-k / top-p (sampling.py) -> token
    scores -> log_softmax -> logprob of the token and the top alternatives
and `verify`, the speculative acceptance of a draft block under the same pipeline,
with the matcher and the penalty history advanced over the drafts and rolled back
on rejection exactly as the cache is.  Does not own: the sampling rules
(sampling.py), the grammar engine (constrained.py) or the loop (generate.py,
the server's scheduler).

Logprobs are natural logs of softmax(scores): after penalties, bias and the grammar
mask, before temperature and truncation (top-k / top-p / min_p) -- so at
temperature 0 the chosen token is always the first of `top`.  Tokens the grammar
refuses have probability 0 and never appear among `top`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from ..errors import ParameterError
from .logits_processors import Controls, History, apply_controls, truncate_min_p
from .sampling import SamplingParams, probs, sample

TOP_LOGPROBS_MAX = 20


@dataclass(frozen=True)
class Pick:
    token: int
    logprob: float | None = None                          # None when logprobs are off
    top: tuple[tuple[int, float], ...] | None = None      # best first; None when off


class TokenPicker:
    def __init__(self, params: SamplingParams, controls: Controls | None = None, constraint=None,
                 logprobs: int | None = None, prompt: Sequence[int] = (),
                 generator: torch.Generator | None = None):
        if logprobs is not None and not 0 <= logprobs <= TOP_LOGPROBS_MAX:
            raise ParameterError("top_logprobs", f"must be in [0, {TOP_LOGPROBS_MAX}], got {logprobs}")
        self.params = params
        self.controls = controls or Controls()
        self.constraint = constraint
        self.logprobs = logprobs
        rep = self.controls.repetition_penalty != 1.0
        self.history = History(frozenset(int(t) for t in prompt) if rep else frozenset())
        self.gen = generator if generator is not None else params.generator()

    @property
    def plain(self) -> bool:
        """Nothing beyond sampling.py: `pick` samples the raw logits (no copy)."""
        return (self.constraint is None and not self.controls.active and self.logprobs is None
                and not self.controls.min_p)

    @property
    def greedy_only(self) -> bool:
        """`pick` is the argmax of the raw logits (plain and greedy): a batch of such rows may be
        reduced together (server/decode_rounds.greedy_picks)."""
        return self.plain and self.params.greedy

    @property
    def end_ids(self) -> frozenset:
        """Ids that end the generation besides the model's end-of-sequence: those the grammar
        admits as its end (e.g. a chat template's end-of-turn)."""
        return self.constraint.eos_ids if self.constraint is not None else frozenset()

    @property
    def stopped(self) -> bool:
        """The grammar admits nothing more: the generation is complete."""
        return self.constraint is not None and self.constraint.stopped

    # ------------------------------------------------------------------ one token
    def scores(self, logits: torch.Tensor) -> torch.Tensor:
        """float32 [vocab]: the logits after controls and the grammar mask (a copy)."""
        # a numpy copy: single-threaded (see Constraint.apply); logits are float32 on the CPU
        s = torch.from_numpy(logits.detach().reshape(-1).float().cpu().numpy().copy())
        if self.controls.active:
            apply_controls(s, self.controls, self.history)
        if self.constraint is not None:
            self.constraint.apply(s)
        return s

    def _draw(self, scores: torch.Tensor) -> int:
        if self.params.greedy:
            return int(torch.argmax(scores))
        return sample(truncate_min_p(scores.clone(), self.controls.min_p, self.params.temperature),
                      self.params, self.gen)

    def _dist(self, scores: torch.Tensor) -> torch.Tensor:
        return probs(truncate_min_p(scores.clone(), self.controls.min_p, self.params.temperature),
                     self.params)

    def _pick(self, scores: torch.Tensor, token: int) -> Pick:
        if self.logprobs is None:
            return Pick(token)
        ls = torch.log_softmax(scores, dim=-1)
        top = ()
        if self.logprobs:
            vals, idx = torch.topk(ls, min(self.logprobs, ls.numel()))
            top = tuple((int(i), float(v)) for v, i in zip(vals.tolist(), idx.tolist())
                        if v != float("-inf"))
        return Pick(token, float(ls[token]), top)

    def record(self, token: int) -> None:
        self.history.add(token)
        if self.constraint is not None:
            self.constraint.accept(token)

    def rollback(self, n: int) -> None:
        """Forget the last `n` recorded tokens (history and matcher)."""
        self.history.undo(n)
        if self.constraint is not None:
            self.constraint.rollback(n)

    def pick(self, logits: torch.Tensor) -> Pick:
        """The next token from `logits` (float32 [vocab]); recorded in history and matcher."""
        if self.plain:
            return Pick(sample(logits, self.params, self.gen))
        s = self.scores(logits)
        if not self.params.greedy and s.numpy().max() == -np.inf:
            raise ParameterError("grammar", "the constraints leave no token to choose")
        tok = self._draw(s)
        if s.numpy()[tok] == -np.inf:
            raise ParameterError("grammar", "the constraints leave no token to choose")
        self.record(tok)
        return self._pick(s, tok)

    # ------------------------------------------------------------------ speculation
    def usable_drafts(self, drafts: Sequence[int], sampled_drafts: bool) -> list[int]:
        """The drafts worth verifying: up to the first one the grammar refuses (kept when the
        drafts were sampled from a draft distribution: its rejection must draw from the
        residual, so it is verified like any other)."""
        drafts = [int(d) for d in drafts]
        if self.constraint is None or not drafts:
            return drafts
        n = self.constraint.valid_prefix(drafts)
        return drafts[:n + 1] if sampled_drafts and n < len(drafts) else drafts[:n]

    def verify(self, rows: torch.Tensor, drafts: Sequence[int], qs=None) -> list[Pick]:
        """Accept a prefix of `drafts` against target logits `rows` [len(drafts) + 1, vocab]
        (row i: the distribution after the i-th block token); returns the accepted drafts'
        picks plus the correction or bonus token's.  Greedy: d kept while it is the argmax.
        Sampling: kept with prob min(1, p/q) (q = 1 for a point-mass draft), else one draw from
        norm(max(0, p - q)).  The history and the matcher advance over the drafts the grammar
        admits, then roll back over the rejected ones -- as the cache does."""
        drafts = [int(d) for d in drafts]
        admitted = (self.constraint.valid_prefix(drafts) if self.constraint is not None
                    else len(drafts))
        scores = []
        for i in range(admitted + 1):                       # tentatively advance over the drafts
            scores.append(self.scores(rows[i]) if not self.plain else rows[i].float())
            if i < admitted:
                self.record(drafts[i])
        accepted, nxt = admitted, None
        for i in range(admitted):
            d = drafts[i]
            if self.params.greedy:
                best = int(torch.argmax(scores[i]))
                if best != d:
                    accepted, nxt = i, best
                    break
                continue
            p = self._dist(scores[i])
            q_d = 1.0 if qs is None else float(qs[i][d])
            if float(torch.rand((), generator=self.gen)) < min(1.0, float(p[d]) / max(q_d, 1e-30)):
                continue
            accepted, nxt = i, self._residual(p, d, None if qs is None else qs[i])
            break
        if nxt is None and accepted < len(drafts):        # the first refused draft: rejected
            if self.params.greedy:
                nxt = int(torch.argmax(scores[accepted]))
            else:
                d = drafts[accepted]
                nxt = self._residual(self._dist(scores[accepted]), d, None if qs is None else qs[accepted])
        self.rollback(admitted - accepted)
        picks = [self._pick(scores[i], drafts[i]) if self.logprobs is not None else Pick(drafts[i])
                 for i in range(accepted)]
        if nxt is None:                                     # every draft kept: the bonus token
            nxt = self._draw(scores[accepted])
        self.record(nxt)
        picks.append(self._pick(scores[accepted], nxt))
        return picks

    def _residual(self, p: torch.Tensor, d: int, q) -> int:
        if q is None:
            r = p.clone()
            r[d] = 0.0
        else:
            r = torch.clamp(p - q, min=0.0)
        if float(r.sum()) <= 0.0:                           # p == q: any draw from p is exact
            r = p
        return int(torch.multinomial(r / r.sum(), 1, generator=self.gen))
