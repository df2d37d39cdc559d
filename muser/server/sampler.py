"""Request-safe sampling: what a client's sampling parameters may do to the worker.

Owns: turning a request's temperature / top_p / top_k / seed into engine
`SamplingParams` (a temperature below `TEMPERATURE_FLOOR` is greedy, as in
vLLM: dividing logits by 1e-38 overflows to inf and the softmax to NaN; a
top_p below `TOP_P_FLOOR` is raised to it -- the same draw, as the most likely
token of any vocabulary under a million ids has p > 1e-6), and
`finite_logits`, which guards every draw against non-finite logits (NaN counts
as "never", +inf as the largest finite value, which then wins a sampled draw
too: sampling.probs) and raises `NonFiniteLogits` only when no finite logit is
left.  Does not own: the sampling maths
(muser.engine.sampling) or what a failed draw does to a request (scheduler.py).
"""
from __future__ import annotations

import torch

from ..engine.sampling import SamplingParams

TEMPERATURE_FLOOR = 1e-5        # below this, temperature sampling is greedy (vLLM's _SAMPLING_EPS)
TOP_P_FLOOR = 1e-6              # float32 rounds top_p = 1e-300 to 0, which would keep no token


class NonFiniteLogits(ArithmeticError):
    """The model produced no finite logit for this request's next token."""


def sampling_params(temperature: float | None, top_p: float | None, top_k: int | None,
                    seed: int | None) -> SamplingParams:
    """Engine sampling parameters for an OpenAI request (temperature defaults to 1, as OpenAI)."""
    t = 1.0 if temperature is None else float(temperature)
    if t < TEMPERATURE_FLOOR:
        t = 0.0
    p = 1.0 if top_p is None else max(float(top_p), TOP_P_FLOOR)
    return SamplingParams(t, p, int(top_k or 0), seed)


def finite_logits(logits: torch.Tensor) -> torch.Tensor:
    """`logits` with NaN mapped to -inf and +inf to the largest finite float32 (so +inf still
    wins a greedy or sampled draw -- at a temperature below 1 through sampling.probs' overflow
    rule -- without making softmax NaN); NonFiniteLogits when no logit is left to choose.
    What every token the scheduler picks goes through (picker.py samples)."""
    if bool(torch.isfinite(logits).all()):
        return logits
    logits = logits.float()
    finite = torch.isfinite(logits)
    big = torch.finfo(torch.float32).max
    logits = torch.nan_to_num(logits, nan=float("-inf"), posinf=big, neginf=float("-inf"))
    if not bool((finite | (logits == big)).any()):
        raise NonFiniteLogits("the model produced no finite logit for the next token")
    return logits
