"""The routing policy, as a pure function over what the router knows of each replica.

Owns: `rank(views, session, keys, imbalance, rng)` -> ranked groups of
replica ids, best first.  Rules, in order:
  1. session affinity -- a replica known to hold the request's session
     (its own routing memory first, then what replicas published);
  2. prefix -- the replicas holding the most leading blocks of the request's
     tokens (`keys.matched_blocks`), when that is at least one block;
  3. everyone else.
A preferred replica whose queue is longer than the shortest queue by more than
`imbalance` is not preferred (one hot session or prefix must not starve the
pool: it then routes like a new request).  Inside a group of equals, at most
two are drawn at random and the caller takes the shorter queue: power of two
choices.  Does not own: queue lengths (Ray's router probes and caches them)
or contacting replicas (router.py).
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

from .keys import matched_blocks


@dataclass
class ReplicaView:
    id: str
    queue: int | None = None                       # ongoing requests (None: unknown -> 0)
    sessions: frozenset[str] = frozenset()         # published session keys
    keys: frozenset[int] = frozenset()             # published block keys of live slots
    holds_session: bool = False    # this router last sent the request's session here
    local_depth: int = 0           # leading request blocks this router last sent here


def two_choices(ids: Sequence[str], rng: random.Random) -> list[str]:
    """Two distinct ids at random (all of them when there are at most two)."""
    ids = list(ids)
    if len(ids) <= 2:
        rng.shuffle(ids)
        return ids
    return rng.sample(ids, 2)


def rank(views: Sequence[ReplicaView], session: str | None, keys: Sequence[int],
         imbalance: int, rng: random.Random) -> tuple[list[list[str]], str]:
    """(groups of replica ids, best first; the rule that picked the first group)."""
    if not views:
        return [], "none"
    q = {v.id: v.queue or 0 for v in views}
    floor = min(q.values())
    cool = [v for v in views if q[v.id] - floor <= imbalance]
    groups: list[list[str]] = []
    why = "balance"
    if session is not None:
        mine = [v.id for v in cool if v.holds_session]
        published = [v.id for v in cool if session in v.sessions and v.id not in mine]
        for owners in (mine, published):
            if owners:
                groups.append(two_choices(owners, rng))
                why = "session"
                break
    if not groups and keys:
        score = {v.id: max(v.local_depth, matched_blocks(keys, v.keys)) for v in cool}
        best = max(score.values(), default=0)
        if best > 0:
            groups.append(two_choices([i for i, s in score.items() if s == best], rng))
            why = "prefix"
    chosen = {i for g in groups for i in g}
    rest = [v.id for v in views if v.id not in chosen]
    if rest:
        groups.append(two_choices(rest, rng))
    everyone = [v.id for v in views]
    if len(everyone) > len(groups[-1]):     # the last resort: everyone, shortest queue wins
        groups.append(everyone)
    return groups, why
