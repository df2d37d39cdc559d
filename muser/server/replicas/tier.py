"""PackDirTier: conversation cuts in a directory every replica can read and write.

Owns: where a cut lives and how it is found again.  Layout under
`DIR/<model>/` (<model>: a hash of the engine's fingerprint and cut encoding,
so two models sharing a directory never see each other's cuts):
  sessions/<session key>.pack   the latest cut of a client session (x-session-id)
  prefix/<block key>-<digest>.pack  a cut of a session-less conversation, named by
                                    the key of its last full routing block
Each pack is written with the server's own `persist.save_slot` (session-pack
format, atomic and durable, HMAC with the pack key, the slot's lineage sealed in) plus an
index `<name>.idx.json` = {position, tokens_sha256}, so `find` can tell
whether a cut is a strict prefix of a prompt without reading the pack.
Loading is `persist.restore_slot` (integrity, model and shape gates before
anything is installed); a refused file is logged, counted and removed, and the
request is served by recomputing.  Past `max_bytes` the oldest files go.

The seam: `find(session, prompt) -> Hit | None`, `load(hit, engine, slot)`,
`save(session, prompt_keys_block, slot_id, snapshot, epoch, replay)`.  The cut
store (muser/store/, disk tier in this same pack format) can stand behind the
same three calls.  Does not own: leasing slots (core.py) or the pack format.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ...errors import PackError, SnapshotError
from ..persist import restore_slot, save_slot
from ..slots import Slot
from .keys import block_keys

log = logging.getLogger("muser.replicas")


def tokens_digest(tokens: Sequence[int]) -> str:
    return hashlib.sha256(json.dumps([int(t) for t in tokens]).encode()).hexdigest()


def model_dir_name(engine) -> str:
    ident = json.dumps({"fingerprint": engine.fingerprint, "encoding": str(engine.encoding)},
                       sort_keys=True, default=str)
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Hit:
    path: Path
    position: int
    kind: str                      # "session" | "prefix" | "lineage"


class _Frozen:
    """A session stand-in whose only ability is returning an already-taken snapshot."""

    def __init__(self, snap):
        self._snap = snap

    def snapshot(self):
        return self._snap


class PackDirTier:
    def __init__(self, root: str | os.PathLike, engine, block: int, pack_key: bytes | None = None,
                 max_bytes: int = 8 << 30, metrics=None):
        self.root = Path(root) / model_dir_name(engine)
        self.block, self.key, self.max_bytes = block, pack_key, max_bytes
        self.metrics = metrics
        (self.root / "sessions").mkdir(parents=True, exist_ok=True)
        (self.root / "prefix").mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------ lookup
    def _index(self, pack: Path) -> dict | None:
        try:
            return json.loads(pack.with_name(pack.name + ".idx.json").read_text())
        except (OSError, ValueError):
            return None

    def _fits(self, pack: Path, prompt: Sequence[int]) -> int:
        """The cut's position when it is a strict prefix of `prompt`, else 0."""
        idx = self._index(pack)
        if not idx or not pack.is_file():
            return 0
        p = int(idx.get("position", 0))
        if 0 < p < len(prompt) and tokens_digest(prompt[:p]) == idx.get("tokens_sha256"):
            return p
        return 0

    def find(self, session: str | None, prompt: Sequence[int]) -> Hit | None:
        """The longest stored cut that `prompt` strictly extends (its session's first).

        A session whose context the policy has shifted holds a retained context that the
        fresh prompt does not extend; its cut comes back as a "lineage" hit (position 0 in
        the comparison): installed, it lets the server's own lineage match continue it."""
        best: Hit | None = None
        if session is not None:
            path = self.root / "sessions" / f"{session}.pack"
            p = self._fits(path, prompt)
            if p:
                best = Hit(path, p, "session")
            elif (self._index(path) or {}).get("shifted") and path.is_file():
                best = Hit(path, 0, "lineage")
        keys = block_keys(prompt, self.block)
        by_block: dict[str, list[Path]] = {}
        for e in os.scandir(self.root / "prefix"):
            if e.name.endswith(".pack"):
                by_block.setdefault(e.name[:16], []).append(Path(e.path))
        for i in range(len(keys) - 1, -1, -1):
            if best is not None and best.position >= (i + 2) * self.block > 0:
                break                  # no cut ending in an earlier block can beat it
            hits = [(self._fits(f, prompt), f) for f in by_block.get(f"{keys[i]:016x}", ())]
            hits = [(p, f) for p, f in hits if p]
            if hits:
                p, f = max(hits)
                if best is None or p > best.position:
                    best = Hit(f, p, "prefix")
                break
        return best

    def load(self, hit: Hit, engine, slot: Slot) -> int:
        """Install `hit` into `slot` (leased by the caller); the installed position, 0 if refused."""
        try:
            restore_slot(engine, slot, hit.path, self.key)
        except Exception as e:            # noqa: BLE001 -- a bad file is a miss, never a 500
            # A refused install leaves the slot as it was; a file that fails its integrity or
            # shape gates is removed (writes are atomic, so it is truly bad), anything else
            # (gone meanwhile, unreadable) is only skipped.
            bad = isinstance(e, (PackError, SnapshotError))
            log.warning("tier: refused %s (%s: %s)%s", hit.path.name, type(e).__name__, e,
                        "; removing it" if bad else "")
            self._count("tier_refused_total")
            if bad:
                self._remove(hit.path)
            return 0
        position = slot.session.position
        self._count("tier_loads_total")
        self._count("tier_loaded_tokens_total", position)
        return position

    # ------------------------------------------------------------------ save
    def save(self, session: str | None, slot_id: int, snap, epoch: int, replay: Any) -> Path | None:
        """Write `snap` (a slot's cut at a turn end) under its session or its last block."""
        tokens = list(snap.tokens)
        if session is not None:
            path = self.root / "sessions" / f"{session}.pack"
        else:
            keys = block_keys(tokens, self.block)
            if not keys:
                return None            # shorter than one block: not worth a file
            path = self.root / "prefix" / f"{keys[-1]:016x}-{tokens_digest(tokens)[:16]}.pack"
        detached = Slot(slot_id, _Frozen(snap), epoch=epoch, replay=replay)
        save_slot(detached, path, self.key)
        idx = {"position": snap.position, "tokens_sha256": tokens_digest(tokens),
               "shifted": replay is not None}
        tmp = path.with_name(path.name + ".idx.tmp")
        tmp.write_text(json.dumps(idx))
        os.replace(tmp, path.with_name(path.name + ".idx.json"))
        self._count("tier_saves_total")
        self._evict()
        return path

    # ------------------------------------------------------------------ housekeeping
    def _remove(self, pack: Path) -> None:
        for p in (pack, pack.with_name(pack.name + ".json"),
                  pack.with_name(pack.name + ".idx.json")):
            try:
                p.unlink()
            except OSError:
                pass

    def _evict(self) -> None:
        packs = []
        total = 0
        for sub in ("sessions", "prefix"):
            for e in os.scandir(self.root / sub):
                if e.name.endswith(".pack"):
                    try:
                        st = e.stat()
                    except OSError:
                        continue
                    packs.append((st.st_mtime, st.st_size, Path(e.path)))
                    total += st.st_size
        for _mtime, size, path in sorted(packs):
            if total <= self.max_bytes:
                break
            self._remove(path)
            total -= size
            self._count("tier_evictions_total")

    def bytes(self) -> int:
        return sum(e.stat().st_size for sub in ("sessions", "prefix")
                   for e in os.scandir(self.root / sub) if e.name.endswith(".pack"))

    def _count(self, name: str, value: float = 1.0) -> None:
        if self.metrics is not None:
            self.metrics.inc(name, value)
