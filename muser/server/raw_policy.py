"""Raw context policy: what a completion prompt keeps when it outgrows the context.  PURE.

Owns: the raw shift plan (`RawPlan`, `plan_raw`: the pinned + configured prefix and
the newest suffix that fits, down to `Limits.low_water`), and the lineage of a shifted
raw context (`RawReplay`, `match_raw_lineage`, `plan_raw_continuation`: whether a
continuation may reuse a slot whose prompt was shifted).  Every function here is a
pure function of its arguments (token counts and token ids); nothing imports torch or
touches a cache.
Does not own: `Limits`, the chat plans and their lineage (policy.py), tokenisation,
rebuilding a cache (the scheduler), or HTTP status codes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..errors import ContextOverflow, RequestError
from .policy import Limits


@dataclass(frozen=True)
class RawPlan:
    """A completion prompt's retained tokens: `tokens[:prefix] + tokens[suffix_start:]`."""

    prefix: int              # leading tokens kept (pinned + keep)
    suffix_start: int        # first token of the newest suffix kept
    total: int               # tokens in the request's prompt
    max_context: int
    output_reserve: int
    reason: str

    @property
    def shifted(self) -> bool:
        return self.suffix_start > self.prefix

    @property
    def dropped(self) -> int:
        return self.suffix_start - self.prefix

    @property
    def kept(self) -> int:
        return self.prefix + self.total - self.suffix_start

    def apply(self, tokens: Sequence[int]) -> list[int]:
        return [*tokens[:self.prefix], *tokens[self.suffix_start:]]


def plan_raw(n_tokens: int, limits: Limits, pinned: int = 0) -> RawPlan:
    """Keep `pinned` (e.g. BOS) + `limits.keep` leading tokens and the newest suffix that fits."""
    budget, M, R = limits.budget, limits.max_context, limits.output_reserve
    if n_tokens < 1:
        raise RequestError("the prompt must contain at least one token")
    if n_tokens <= budget:
        return RawPlan(n_tokens, n_tokens, n_tokens, M, R,
                       f"fits: {n_tokens} prompt + {R} reserve <= {M}")
    if limits.policy == "error":
        raise ContextOverflow(
            f"context too long: the prompt has {n_tokens} tokens + {R} output reserve = "
            f"{n_tokens + R}, max_context is {M} (context policy 'error')",
            needed=n_tokens + R, limit=M)
    prefix = min(pinned + limits.keep, n_tokens)
    if prefix + 1 > budget:
        raise ContextOverflow(
            f"context too long: the kept prefix ({prefix} tokens) + at least 1 newest token + "
            f"{R} output reserve = {prefix + 1 + R}, max_context is {M}",
            needed=prefix + 1 + R, limit=M)
    kept = max(limits.low_water, prefix + 1)  # down to the low-water mark, >= 1 newest token
    suffix_start = n_tokens - (kept - prefix)
    return RawPlan(prefix, suffix_start, n_tokens, M, R,
                   f"shifted: kept {prefix} prefix + {n_tokens - suffix_start} newest tokens, "
                   f"dropped {suffix_start - prefix}; {kept} prompt + {R} reserve <= {M} "
                   f"(low-water mark {limits.low_water})")


@dataclass(frozen=True)
class RawReplay:
    """What a slot's shifted raw context was built from."""

    prefix: tuple[int, ...]     # the kept leading tokens
    suffix_start: int           # where the kept suffix began in the request's prompt
    epoch: int


def match_raw_lineage(replay: RawReplay, tokens: Sequence[int]) -> int | None:
    """`suffix_start` if `tokens` continues the shifted prompt `replay` was built from."""
    p = len(replay.prefix)
    if len(tokens) <= replay.suffix_start or tuple(tokens[:p]) != replay.prefix:
        return None
    return replay.suffix_start


def plan_raw_continuation(tokens: Sequence[int], limits: Limits, replay: RawReplay,
                          pinned: int = 0) -> RawPlan | None:
    """A plan that keeps the slot's prefix and suffix start, when it still fits; else None."""
    s = match_raw_lineage(replay, tokens)
    if s is None:
        return None
    p = len(replay.prefix)
    kept = p + len(tokens) - s
    if kept > limits.budget:
        return None
    return RawPlan(p, s, len(tokens), limits.max_context, limits.output_reserve,
                   f"continuation of a shifted prompt (epoch {replay.epoch}): {kept} prompt + "
                   f"{limits.output_reserve} reserve <= {limits.max_context}")
