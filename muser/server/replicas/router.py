"""MuserRouter: muser's routing policy as a Ray Serve request router.

Owns: plugging `routing.rank` into Ray Serve's `RequestRouter` extension point
(configured through `RequestRouterConfig` on the engine deployment, so it runs
inside every handle that calls the replicas -- the ingress), building each
replica's view from what it publishes through `record_routing_stats`
({"sessions": [...], "keys": [...]}, refreshed every `stats_period_s`) and
Ray's cached queue lengths, and a bounded memory of where this router last
sent each session and prefix (so the next turn follows at once, before the
replica's next publication).  Ray's base class then probes the queue lengths
of each offered group and takes the shortest that accepts.
Does not own: the policy itself (routing.py) or the keys (keys.py).
"""
from __future__ import annotations

import logging
import random
from collections import OrderedDict
from typing import List, Optional

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from .routing import ReplicaView, rank
from .wire import Forwarded

log = logging.getLogger("muser.replicas")


class MuserRouter(RequestRouter):
    def initialize_state(self, imbalance: int = 8, memory: int = 200_000, seed: int | None = None):
        self._imbalance = int(imbalance)
        self._memory = int(memory)
        self._rng = random.Random(seed)
        self._session_owner: OrderedDict[str, ReplicaID] = OrderedDict()
        self._key_owner: OrderedDict[int, ReplicaID] = OrderedDict()
        self._published: dict[ReplicaID, tuple[int, frozenset, frozenset]] = {}
        self.decisions: dict[str, int] = {}           # rule -> count (for tests and logs)

    # ------------------------------------------------------------------ replica set
    def update_replicas(self, replicas: List[RunningReplica]) -> None:
        super().update_replicas(replicas)
        self._forget_gone()

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._forget_gone()

    def _forget_gone(self) -> None:
        live = set(self._replicas)
        for table in (self._session_owner, self._key_owner):
            for k in [k for k, r in table.items() if r not in live]:
                del table[k]
        for r in [r for r in self._published if r not in live]:
            del self._published[r]

    def _publication(self, replica: RunningReplica) -> tuple[frozenset, frozenset]:
        stats = replica.routing_stats or {}
        cached = self._published.get(replica.replica_id)
        if cached is not None and cached[0] == id(stats):
            return cached[1], cached[2]
        sessions = frozenset(stats.get("sessions", ()))
        keys = frozenset(stats.get("keys", ()))
        self._published[replica.replica_id] = (id(stats), sessions, keys)
        return sessions, keys

    # ------------------------------------------------------------------ routing
    async def choose_replicas(self, candidate_replicas: List[RunningReplica],
                              pending_request: Optional[PendingRequest] = None
                              ) -> List[List[RunningReplica]]:
        if not candidate_replicas:
            return []
        fwd = _forwarded(pending_request)
        session = fwd.session if fwd else None
        keys = list(fwd.keys) if fwd else []
        depth: dict[ReplicaID, int] = {}
        for i, k in enumerate(keys):
            owner = self._key_owner.get(k)
            if owner is not None:
                depth[owner] = i + 1
        owner = self._session_owner.get(session) if session else None
        by_id: dict[str, RunningReplica] = {}
        views = []
        for r in candidate_replicas:
            rid = r.replica_id.unique_id
            by_id[rid] = r
            sessions, published = self._publication(r)
            views.append(ReplicaView(
                rid, self._replica_queue_len_cache.get(r.replica_id), sessions, published,
                holds_session=owner == r.replica_id, local_depth=depth.get(r.replica_id, 0)))
        groups, why = rank(views, session, keys, self._imbalance, self._rng)
        self.decisions[why] = self.decisions.get(why, 0) + 1
        if pending_request is not None:
            pending_request.routing_context.should_backoff = True
        return [[by_id[i] for i in g] for g in groups]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result) -> None:
        fwd = _forwarded(pending_request)
        if fwd is None:
            return
        if fwd.session:
            _remember(self._session_owner, fwd.session, replica_id, self._memory)
        for k in fwd.keys:
            _remember(self._key_owner, k, replica_id, self._memory)


def _forwarded(pending_request: Optional[PendingRequest]) -> Forwarded | None:
    if pending_request is None or not pending_request.args:
        return None
    arg = pending_request.args[0]
    return arg if isinstance(arg, Forwarded) else None


def _remember(table: OrderedDict, key, value, limit: int) -> None:
    table[key] = value
    table.move_to_end(key)
    while len(table) > limit:
        table.popitem(last=False)
