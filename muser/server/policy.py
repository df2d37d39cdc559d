"""Context policy: what a conversation keeps when it outgrows the context.  PURE.

Owns: `Limits` (budget, low-water mark), splitting chat messages into a
system prologue and whole turns, the chat shift plan (drop oldest whole turns
until system + retained turns + output reserve fit), and the chat lineage
check that decides whether a continuation may reuse a slot whose context was
shifted.  Every function here is a pure function of its arguments: messages
are plain dicts, token counts come from a caller-given
`count(messages) -> int`, and nothing imports torch or touches a cache.
Does not own: the raw shift plan (configured prefix + newest suffix) and its
lineage (`RawPlan`, `plan_raw`, `RawReplay`, `match_raw_lineage`,
`plan_raw_continuation`: moved to raw_policy.py), tokenisation, rebuilding a
cache (the scheduler prefills the retained context into staging and swaps),
or HTTP status codes.

Low-water mark: a shift drops context down to `Limits.low_water` prompt tokens
(`shift_keep` x budget), not merely until the prompt fits.  Dropping only the
minimum leaves a few tokens of slack, so the next turn of the same
conversation overflows again and the cache is rebuilt on every turn; with a
low-water mark the next turns extend the shifted cache until the slack is used
up.  A continuation that still fits the budget is never shifted.

Chat rule: a turn begins at each user message and everything after it
(assistant replies, tool results, ...) stays attached.  Messages between the
system prologue and the first user message form a leading turn of their own.
System (and developer) messages must all come first, else the request is
refused: a shift could not keep them without reordering the conversation.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Mapping, Sequence

from ..errors import ContextOverflow, RequestError

Message = Mapping[str, object]
Policy = Literal["shift", "error"]
SYSTEM_ROLES = frozenset({"system", "developer"})


@dataclass(frozen=True)
class Limits:
    max_context: int
    output_reserve: int
    policy: Policy = "shift"
    keep: int = 0                  # raw shifting: prefix tokens always kept (after `pinned`)
    shift_keep: float = 1.0        # a shift keeps at most this fraction of the budget

    def __post_init__(self):
        if self.max_context < 1:
            raise RequestError(f"max_context must be >= 1, got {self.max_context}")
        if not 0 <= self.output_reserve < self.max_context:
            raise RequestError(f"output_reserve must be in [0, {self.max_context}), "
                               f"got {self.output_reserve}")
        if self.keep < 0:
            raise RequestError(f"keep must be >= 0, got {self.keep}")
        if self.policy not in ("shift", "error"):
            raise RequestError(f"context policy must be 'shift' or 'error', got {self.policy!r}")
        if not (isinstance(self.shift_keep, (int, float)) and 0.0 < self.shift_keep <= 1.0):
            raise RequestError(f"shift_keep must be in (0, 1], got {self.shift_keep!r}")

    @property
    def budget(self) -> int:
        """Prompt tokens that fit once the output reserve is set aside."""
        return self.max_context - self.output_reserve

    @property
    def low_water(self) -> int:
        """Prompt tokens a shift keeps at most (>= 1): `shift_keep` of the budget, rounded down."""
        return max(1, int(self.shift_keep * self.budget))


# --------------------------------------------------------------------------- chat
@dataclass(frozen=True)
class ChatSplit:
    system: tuple[Message, ...]
    turns: tuple[tuple[Message, ...], ...]


def split_chat(messages: Sequence[Message]) -> ChatSplit:
    """System prologue + turns (each beginning at a user message)."""
    if not messages:
        raise RequestError("messages must contain at least one message")
    system: list[Message] = []
    turns: list[list[Message]] = []
    for i, m in enumerate(messages):
        role = m.get("role")
        if role in SYSTEM_ROLES:
            if turns:
                raise RequestError(
                    f"system messages must all come before the conversation: message {i} "
                    f"has role {role!r} after a {turns[-1][-1].get('role')!r} message")
            system.append(m)
        elif role == "user" or not turns:
            turns.append([m])
        else:
            turns[-1].append(m)
    return ChatSplit(tuple(system), tuple(tuple(t) for t in turns))


@dataclass(frozen=True)
class ChatPlan:
    """What a chat request keeps, and the numbers that decided it."""

    system: tuple[Message, ...]
    turns: tuple[tuple[Message, ...], ...]   # retained turns, oldest first
    first_kept: int          # index of the oldest retained turn in the request's turns
    total_turns: int
    prompt_tokens: int       # tokens of system + retained turns (+ generation prompt)
    full_tokens: int | None  # tokens of the whole conversation, when it was counted
    max_context: int
    output_reserve: int
    reason: str

    @property
    def dropped_turns(self) -> int:
        return self.first_kept

    @property
    def shifted(self) -> bool:
        return self.first_kept > 0

    def messages(self) -> list[Message]:
        return [*self.system, *(m for t in self.turns for m in t)]

    def replay(self, epoch: int) -> "ReplayPlan":
        return ReplayPlan(self.system, tuple(m for t in self.turns for m in t), epoch)


def plan_chat(messages: Sequence[Message], count: Callable[[list[Message]], int],
              limits: Limits, start: int = 0) -> ChatPlan:
    """Keep the system prologue and the newest whole turns that fit.

    A conversation that fits `limits.budget` is kept whole.  One that does not
    is shifted: the oldest turns are dropped until the rest fits the low-water
    mark (`limits.low_water`), or, when the newest turn alone is above the mark
    but within the budget, only the newest turn is kept.  `start` drops the first `start` turns unconditionally (a continuation of a
    conversation a slot already shifted).  Token counts are assumed to shrink
    as turns are dropped (binary search); the chosen plan is always verified.
    Raises ContextOverflow under the error policy when the whole conversation
    does not fit, and under the shift policy when system + newest turn + reserve
    cannot fit.
    """
    split = split_chat(messages)
    n = len(split.turns)
    if not 0 <= start <= max(n - 1, 0):
        raise RequestError(f"plan start must be in [0, {max(n - 1, 0)}], got {start}")
    counts: dict[int, int] = {}

    def tokens(i: int) -> int:
        if i not in counts:
            counts[i] = count([*split.system, *(m for t in split.turns[i:] for m in t)])
        return counts[i]

    budget, M, R = limits.budget, limits.max_context, limits.output_reserve

    def plan(i: int, reason: str) -> ChatPlan:
        return ChatPlan(split.system, split.turns[i:], i, n, tokens(i), counts.get(0),
                        M, R, reason)

    if tokens(start) <= budget:
        why = "fits" if start == 0 else f"continuation after {start} dropped turns fits"
        return plan(start, f"{why}: {tokens(start)} prompt + {R} reserve <= {M}")
    if limits.policy == "error":
        raise ContextOverflow(
            f"context too long: the conversation needs {tokens(start)} prompt tokens + "
            f"{R} output reserve = {tokens(start) + R}, max_context is {M} "
            f"(context policy 'error')", needed=tokens(start) + R, limit=M)
    last = n - 1
    if n == 0 or last == start or tokens(last) > budget:
        need = tokens(max(last, start))
        raise ContextOverflow(
            f"context too long: system content and the newest complete turn need {need} "
            f"tokens + {R} output reserve = {need + R}, max_context is {M}; "
            f"even after dropping {max(last, 0)} older turn(s) it cannot fit",
            needed=need + R, limit=M)
    target = limits.low_water
    if tokens(last) > target:                 # only the newest turn fits (above the mark)
        return plan(last, f"shifted: dropped {last} of {n} turns; {tokens(last)} prompt + {R} "
                          f"reserve <= {M} (the newest turn alone is above the low-water mark "
                          f"of {target})")
    lo, hi = start, last                      # tokens(lo) > target >= tokens(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if tokens(mid) <= target:
            hi = mid
        else:
            lo = mid
    return plan(hi, f"shifted: dropped {hi} of {n} turns; {tokens(hi)} prompt + {R} reserve "
                    f"<= {M}, kept <= low-water mark {target} (keeping turn {hi - 1} too would "
                    f"need {tokens(hi - 1)})")


@dataclass(frozen=True)
class ReplayPlan:
    """What a slot's live context was built from: the lineage a continuation must match."""

    system: tuple[Message, ...]
    kept: tuple[Message, ...]      # retained messages, flattened, oldest first
    epoch: int


def match_lineage(replay: ReplayPlan, messages: Sequence[Message]) -> int | None:
    """Index of the turn where `replay`'s retained messages begin in `messages`, or None.

    Matches only under identical leading system content, with the retained
    messages appearing as one exact ordered run starting at a turn boundary
    (the newest retained turn may have grown: the assistant's reply and later
    messages follow it).  Of several matches the newest wins.
    """
    try:
        split = split_chat(messages)
    except RequestError:
        return None
    if tuple(split.system) != tuple(replay.system) or not replay.kept:
        return None
    k = len(replay.kept)
    flat = [m for t in split.turns for m in t]
    starts, at = [], 0
    for t in split.turns:
        starts.append(at)
        at += len(t)
    for j in range(len(split.turns) - 1, -1, -1):
        s = starts[j]
        if s + k <= len(flat) and all(a == b for a, b in zip(flat[s:s + k], replay.kept)):
            return j
    return None
