"""Slot persistence: a slot's session written to / read from a pack in --session-dir.

Owns: validating slot ids and file names (no path traversal: one plain name
inside the session directory), saving a slot's cut with
`muser.pack.save_pack` plus a JSON sidecar (the slot's replay plan and
context epoch, so a shifted conversation keeps its lineage across a
restart), and restoring both (the cut is gated before anything is installed;
a refused pack leaves the slot as it was).  Does not own: the pack format
(muser.pack.format) or leasing (slots.py).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from ..pack import load_pack, save_pack
from .http_errors import InvalidRequest, NotFound
from .policy import RawReplay, ReplayPlan
from .slots import Slot

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
SLOT_ID = re.compile(r"^[0-9]{1,4}$")


def parse_slot_id(raw: str, n_slots: int) -> int:
    if not SLOT_ID.fullmatch(raw or "") or int(raw) >= n_slots:
        raise NotFound(f"no slot {raw!r}: slot ids are 0..{n_slots - 1}", param="slot_id")
    return int(raw)


def pack_path(session_dir: str | None, filename: str | None, slot_id: int) -> Path:
    if session_dir is None:
        raise NotFound("session persistence is off: start the server with --session-dir")
    name = filename if filename is not None else f"slot-{slot_id}.pack"
    if not isinstance(name, str) or not NAME.fullmatch(name) or ".." in name:
        raise InvalidRequest(f"invalid file name {name!r}: use 1-128 of [A-Za-z0-9._-], "
                             "starting with a letter or digit", param="filename")
    root = Path(session_dir).resolve()
    path = (root / name).resolve()
    if path.parent != root:
        raise InvalidRequest(f"invalid file name {name!r}", param="filename")
    return path


def _digest(tokens) -> str:
    return hashlib.sha256(json.dumps(list(tokens)).encode()).hexdigest()


def _replay_json(replay) -> dict | None:
    if isinstance(replay, ReplayPlan):
        return {"kind": "chat", "system": [dict(m) for m in replay.system],
                "kept": [dict(m) for m in replay.kept], "epoch": replay.epoch}
    if isinstance(replay, RawReplay):
        return {"kind": "raw", "prefix": list(replay.prefix), "suffix_start": replay.suffix_start,
                "epoch": replay.epoch}
    return None


def _replay_from(d: dict | None):
    if not d:
        return None
    if d.get("kind") == "chat":
        return ReplayPlan(tuple(d["system"]), tuple(d["kept"]), int(d["epoch"]))
    if d.get("kind") == "raw":
        return RawReplay(tuple(int(t) for t in d["prefix"]), int(d["suffix_start"]), int(d["epoch"]))
    return None


def save_slot(slot: Slot, path: Path, key: bytes | None) -> dict:
    """Worker-free: the caller holds the slot's lease."""
    snap = slot.session.snapshot()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_pack(snap, path, key=key)                  # atomic and durable (muser.pack.format)
    side = {"epoch": slot.epoch, "position": snap.position, "tokens_sha256": _digest(snap.tokens),
            "replay": _replay_json(slot.replay)}
    stmp = path.with_name(path.name + ".json.tmp")
    stmp.write_text(json.dumps(side))
    os.replace(stmp, path.with_name(path.name + ".json"))
    return {"slot": slot.id, "filename": path.name, "position": snap.position,
            "context_epoch": slot.epoch, "bytes": path.stat().st_size}


def restore_slot(engine, slot: Slot, path: Path, key: bytes | None) -> dict:
    if not path.is_file():
        raise NotFound(f"no session file {path.name!r} in the session directory", param="filename")
    snap = load_pack(path, key=key)                 # integrity / auth / version checked here
    engine.restore(snap, into=slot.session)         # shape / encoding / model gate, then install
    side_path = path.with_name(path.name + ".json")
    replay, epoch = None, 0
    try:
        side = json.loads(side_path.read_text())
        if side.get("position") == snap.position and side.get("tokens_sha256") == _digest(snap.tokens):
            replay, epoch = _replay_from(side.get("replay")), int(side.get("epoch", 0))
    except (OSError, ValueError, KeyError, TypeError):
        pass                                         # no lineage: reuse by token prefix only
    slot.replay, slot.epoch = replay, epoch
    return {"slot": slot.id, "filename": path.name, "position": snap.position,
            "context_epoch": epoch}
