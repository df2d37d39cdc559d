"""ReplicaCore: one engine replica -- muser's own server app, plus what a fleet needs.

Owns, around an unchanged `create_app(engine, config)` (slots, staging,
policy, scheduler, responses: the single-process server, not a fork):
  * serving a `Forwarded` request through that app in-process (bridge.py),
    streaming back ("accepted", name), ("start", status, headers), ("body", b)*;
  * before a generation request: when the shared tier holds a longer cut of
    the prompt than any free slot does live, installing it into a free slot
    (the app's own placement then picks that slot: cached_tokens counts it);
  * at a turn end (tier save "turns"): taking the slot's cut and writing it
    to the tier *before* the response's last piece leaves, so a reply the
    client has fully received survives this replica;
  * publishing routing keys (hashed sessions, block keys of live slots),
    health and metrics; draining (saving live slots) when the replica stops.
Leases here are the pool's own: a slot is marked busy while its cut is taken
or installed, and released through `SlotPool.release` (which also serves any
waiter).  Does not own: Ray (deployments.py), the pack format, placement.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from typing import AsyncIterator

from ..app import create_app
from ..slots import Slot, extension
from . import bridge
from .keys import extend_keys
from .settings import ReplicaSpec
from .tier import PackDirTier
from .wire import Forwarded

log = logging.getLogger("muser.replicas")
MAX_PUBLISHED_KEYS = 1 << 16


class ReplicaCore:
    def __init__(self, engine, spec: ReplicaSpec, name: str):
        self.engine, self.spec, self.name = engine, spec, name
        self.app = create_app(engine, dataclasses.replace(spec.server, replica=name))
        self.state = self.app.state.muser
        self.block = spec.routing.block_tokens
        self.tier = None
        if spec.tier.dir is not None:
            self.tier = PackDirTier(spec.tier.dir, engine, self.block, spec.tier.pack_key,
                                    spec.tier.max_bytes, metrics=self.state.metrics)
        self._lifespan = bridge.Lifespan(self.app)
        self._keys: dict[int, tuple[int, list[int], list[int]]] = {}   # slot -> (session id, tokens, keys)
        self._held: dict[int, tuple[str, int, list[int] | int]] = {}    # slot -> (session, position, check)
        self._saved: dict[int, tuple[int, int]] = {}                    # slot -> (session id, position)
        self._stopped = False

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        await self._lifespan.startup()

    async def stop(self) -> None:
        """Drain: save every live slot to the tier, then stop the worker."""
        if self._stopped:
            return
        self._stopped = True
        try:
            await self.drain()
        finally:
            await self._lifespan.shutdown()

    async def drain(self) -> int:
        if self.tier is None:
            return 0
        n = 0
        for slot in self.state.pool.slots:
            if slot.session.position == 0 or slot.busy:
                continue
            if self._saved.get(slot.id) == (id(slot.session), slot.session.position):
                continue                                  # already in the tier at this point
            if await self._save(slot, self._session_of(slot)):
                n += 1
        log.info("replica %s drained: %d slot(s) saved to the tier", self.name, n)
        return n

    # ------------------------------------------------------------------ serving
    async def handle(self, fwd: Forwarded) -> AsyncIterator[tuple]:
        yield ("accepted", self.name)
        if self.tier is not None and fwd.generation and fwd.prompt:
            await self._install_from_tier(fwd)
        status, sse, tail = 0, False, b""
        async for msg in bridge.call(self.app, fwd):
            if msg["type"] == "http.response.start":
                status = msg["status"]
                headers = [(bytes(k), bytes(v)) for k, v in msg.get("headers", [])]
                sse = dict(headers).get(b"content-type", b"").startswith(b"text/event-stream")
                yield ("start", status, headers)
            elif msg["type"] == "http.response.body":
                body = bytes(msg.get("body", b""))
                if not sse:
                    tail += body                  # a JSON body: kept whole to read muser.slot
                elif b'"muser"' in body:
                    tail = body                   # an SSE event that names the slot
                if msg.get("more_body", False):
                    yield ("body", body)
                    continue
                if status == 200 and fwd.generation:
                    await self._turn_end(tail, fwd.session)    # before the last piece leaves
                yield ("body", body)

    # ------------------------------------------------------------------ tier
    async def _install_from_tier(self, fwd: Forwarded) -> None:
        pool = self.state.pool
        free = [s for s in pool.slots if not s.busy]
        if not free or not pool.healthy:
            return
        prompt = list(fwd.prompt)
        live = {s.id: extension(s.tokens, prompt) for s in free}
        best_live = max(live.values())
        hit = await asyncio.to_thread(self.tier.find, fwd.session, prompt)
        if hit is None:
            return
        if hit.kind == "lineage":            # a shifted session: unless it is live here already
            if best_live or any(self._session_of(s) == fwd.session for s in pool.slots):
                return
        elif hit.position <= best_live:
            return                           # a free slot holds at least as much live
        # The slot of the same conversation when one holds part of it, else the least recently used.
        target = max(free, key=lambda s: (live[s.id], -s.last_used, -s.id))
        if target.busy:
            return
        target.busy = True
        try:
            got = await asyncio.to_thread(self.tier.load, hit, self.engine, target)
        finally:
            pool.release(target)
        if got:
            log.info("replica %s: installed a %s cut of %d tokens into slot %d", self.name,
                     hit.kind, got, target.id)
            self._saved[target.id] = (id(target.session), target.session.position)
            if fwd.session is not None:
                self._note_session(target, fwd.session)

    async def _turn_end(self, tail: bytes, session: str | None) -> None:
        """Note which session the slot now holds; with tier save "turns", save its cut."""
        slot_id = _slot_of(tail)
        if slot_id is None or not 0 <= slot_id < len(self.state.pool.slots):
            return
        slot = self.state.pool.slots[slot_id]
        if slot.busy:
            return                           # a newer request owns it already
        if session is not None:
            self._note_session(slot, session)
        if self.tier is not None and self.spec.tier.save == "turns":
            await self._save(slot, session)

    async def _save(self, slot: Slot, session: str | None) -> bool:
        pool = self.state.pool
        if slot.busy or not pool.healthy or slot.session.position == 0:
            return False                     # a newer request owns it: that one saves later
        slot.busy = True
        try:
            snap = await asyncio.to_thread(slot.session.snapshot)
            epoch, replay, ident = slot.epoch, slot.replay, id(slot.session)
        finally:
            pool.release(slot)
        try:
            await asyncio.to_thread(self.tier.save, session, slot.id, snap, epoch, replay)
        except Exception as e:               # noqa: BLE001 -- a failed save never fails a reply
            log.warning("replica %s: tier save of slot %d failed: %s: %s", self.name, slot.id,
                        type(e).__name__, e)
            self.state.metrics.inc("tier_save_failures_total")
            return False
        self._saved[slot.id] = (ident, snap.position)
        return True

    # ------------------------------------------------------------------ sessions held
    def _note_session(self, slot: Slot, session: str) -> None:
        tokens = list(slot.tokens)
        keys = self._slot_keys(slot)
        check = keys[-1] if keys else tokens
        self._held[slot.id] = (session, len(tokens), check)

    def _session_of(self, slot: Slot) -> str | None:
        held = self._held.get(slot.id)
        if held is None:
            return None
        session, position, check = held
        tokens = slot.tokens
        if len(tokens) < position:
            return None
        if isinstance(check, list):
            return session if list(tokens[:position]) == check else None
        keys = self._slot_keys(slot)
        n = position // self.block
        return session if len(keys) >= n and keys[n - 1] == check else None

    def _slot_keys(self, slot: Slot) -> list[int]:
        tokens = list(slot.tokens)
        cached = self._keys.get(slot.id)
        if cached and cached[0] == id(slot.session) and tokens[:len(cached[1])] == cached[1]:
            keys = extend_keys(cached[2], tokens, self.block)
        else:
            keys = extend_keys([], tokens, self.block)
        self._keys[slot.id] = (id(slot.session), tokens, keys)
        return keys

    # ------------------------------------------------------------------ publishing
    def routing_stats(self) -> dict:
        keys: set[int] = set()
        sessions = []
        for slot in self.state.pool.slots:
            keys.update(self._slot_keys(slot))
            s = self._session_of(slot)
            if s is not None:
                sessions.append(s)
        if len(keys) > MAX_PUBLISHED_KEYS:   # keep it compact; the router's memory covers the rest
            keys = set(sorted(keys)[:MAX_PUBLISHED_KEYS])
        return {"sessions": sessions, "keys": sorted(keys)}

    def status(self, metrics: bool = True) -> dict:
        pool = self.state.pool
        out = {"replica": self.name, "healthy": pool.healthy, "reason": pool.unhealthy_reason,
               "model": self.state.model_id, "slots": len(pool.slots), "busy": pool.busy_count,
               "queued": pool.queue_depth,
               "positions": [s.session.position for s in pool.slots]}
        if metrics:
            out["metrics"] = self.state.metrics.render()
        return out

    def check_health(self) -> None:
        if not self.state.pool.healthy:
            raise RuntimeError(f"replica {self.name} is unhealthy: {self.state.pool.unhealthy_reason}")


def _slot_of(tail: bytes) -> int | None:
    """The `muser.slot` of a response: a JSON body, or the last SSE event that carries it."""
    text = tail.decode("utf-8", "replace")
    candidates = [text]
    if "data:" in text:
        candidates = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
    for c in reversed(candidates):
        try:
            obj = json.loads(c)
        except ValueError:
            continue
        ext = obj.get("muser") if isinstance(obj, dict) else None
        if isinstance(ext, dict) and isinstance(ext.get("slot"), int):
            return ext["slot"]
    return None
