"""Slot persistence: a slot's session written to / read from a pack in --session-dir.

Owns: validating slot ids and file names (one plain name inside the session
directory: no path traversal, no symbolic links, no directories or other
non-regular files), saving a slot's cut with its replay plan and context
epoch folded into the pack's manifest as `meta` (so a shifted conversation
keeps its lineage across a restart, sealed by the same HMAC as the rows, and
no second file can be swapped, leaked or overwritten beside it), and
restoring both -- the pack is checked and its `meta` parsed strictly before
anything is installed, so a refused pack or a malformed `meta` leaves the
slot exactly as it was.  Does not own: the pack format (muser.pack.format:
temporaries are O_EXCL and 0600, the swap is atomic) or leasing (slots.py).
"""
from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from .http_errors import InvalidRequest, NotFound, clip
from .policy import SYSTEM_ROLES, ReplayPlan
from .raw_policy import RawReplay
from .slots import Slot

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
SLOT_ID = re.compile(r"^[0-9]{1,4}$")
META_KIND = "muser.server.slot"
ROLES = SYSTEM_ROLES | {"user", "assistant", "tool"}


def parse_slot_id(raw: str, n_slots: int) -> int:
    if not SLOT_ID.fullmatch(raw or "") or int(raw) >= n_slots:
        raise NotFound(f"no slot {clip(raw, 16)!r}: slot ids are 0..{n_slots - 1}", param="slot_id")
    return int(raw)


def pack_path(session_dir: str | None, filename, slot_id: int) -> Path:
    if session_dir is None:
        raise NotFound("session persistence is off: start the server with --session-dir")
    name = filename if filename is not None else f"slot-{slot_id}.pack"
    if not isinstance(name, str) or not NAME.fullmatch(name) or ".." in name:
        shown = clip(name, 40) if isinstance(name, str) else type(name).__name__
        raise InvalidRequest(f"invalid file name {shown!r}: use 1-128 of [A-Za-z0-9._-], "
                             "starting with a letter or digit", param="filename")
    return Path(session_dir).resolve() / name


def _check_plain_file(path: Path, must_exist: bool) -> None:
    """400 unless `path` is a regular file (or, when saving, absent); never follows a link."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if must_exist:
            raise NotFound(f"no session file {path.name!r} in the session directory",
                           param="filename") from None
        return
    kind = ("a symbolic link" if stat.S_ISLNK(st.st_mode) else "a directory"
            if stat.S_ISDIR(st.st_mode) else None if stat.S_ISREG(st.st_mode) else "not a regular file")
    if kind is not None:
        raise InvalidRequest(f"session file {path.name!r} is {kind}; session files are plain "
                             "files in the session directory", param="filename")


def _replay_json(replay) -> dict | None:
    if isinstance(replay, ReplayPlan):
        return {"kind": "chat", "system": [dict(m) for m in replay.system],
                "kept": [dict(m) for m in replay.kept], "epoch": replay.epoch}
    if isinstance(replay, RawReplay):
        return {"kind": "raw", "prefix": list(replay.prefix), "suffix_start": replay.suffix_start,
                "epoch": replay.epoch}
    return None


def _bad(name: str, what: str, expected: str, found) -> InvalidRequest:
    return InvalidRequest(f"session file {name!r}: slot meta field {what} expected {expected}, found "
                          f"{clip(repr(found), 60)}; nothing was restored", param="filename")


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _messages(name: str, what: str, v) -> tuple[dict, ...]:
    if not isinstance(v, list):
        raise _bad(name, what, "a list of messages", v)
    for m in v:
        if not (isinstance(m, dict) and set(m) == {"role", "content"} and m["role"] in ROLES
                and isinstance(m["content"], str)):
            raise _bad(name, f"a message in {what}", "{role, content} strings", m)
    return tuple(dict(m) for m in v)


def replay_from_meta(name: str, meta, vocab: int) -> tuple[object, int]:
    """(replay plan or None, context epoch) from a pack's `meta`; 400 on anything malformed."""
    if meta is None:
        return None, 0                         # a pack saved elsewhere: reuse by token prefix only
    if not isinstance(meta, dict) or meta.get("kind") != META_KIND:
        raise _bad(name, "(the whole)", f"an object of kind {META_KIND!r}", meta)
    epoch, r = meta.get("epoch"), meta.get("replay")
    if not _count(epoch):
        raise _bad(name, "epoch", "an int >= 0", epoch)
    if r is None:
        return None, epoch
    if not isinstance(r, dict) or not _count(r.get("epoch")):
        raise _bad(name, "replay", "an object with an int epoch", r)
    if r.get("kind") == "chat" and set(r) == {"kind", "system", "kept", "epoch"}:
        return ReplayPlan(_messages(name, "replay.system", r["system"]),
                          _messages(name, "replay.kept", r["kept"]), r["epoch"]), epoch
    if r.get("kind") == "raw" and set(r) == {"kind", "prefix", "suffix_start", "epoch"}:
        prefix, start = r["prefix"], r["suffix_start"]
        if not (isinstance(prefix, list) and all(_count(t) and t < vocab for t in prefix)):
            raise _bad(name, "replay.prefix", f"token ids in [0, {vocab})", prefix)
        if not (_count(start) and start >= len(prefix)):
            raise _bad(name, "replay.suffix_start", "an int >= the prefix length", start)
        return RawReplay(tuple(prefix), start, r["epoch"]), epoch
    raise _bad(name, "replay", "a chat or raw replay plan", r)


def save_slot(slot: Slot, path: Path, key: bytes | None) -> dict:
    """Worker-free: the caller holds the slot's lease."""
    from ..pack.format import save_pack
    snap = slot.session.snapshot()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    _check_plain_file(path, must_exist=False)
    meta = {"kind": META_KIND, "epoch": slot.epoch, "replay": _replay_json(slot.replay)}
    save_pack(snap, path, key=key, meta=meta)      # O_EXCL 0600 temporary, fsync, atomic swap
    return {"slot": slot.id, "filename": path.name, "position": snap.position,
            "context_epoch": slot.epoch, "bytes": os.lstat(path).st_size}


def restore_slot(engine, slot: Slot, path: Path, key: bytes | None) -> dict:
    from ..pack.reader import read_pack
    _check_plain_file(path, must_exist=True)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:                           # swapped for a link or removed meanwhile
        raise InvalidRequest(f"session file {path.name!r} cannot be opened: {e.strerror}",
                             param="filename") from None
    f = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        f.close()
        raise InvalidRequest(f"session file {path.name!r} is not a regular file", param="filename")
    snap, _, meta = read_pack(f, key=key)          # integrity / auth / version checked here
    replay, epoch = replay_from_meta(path.name, meta, engine.spec.vocab_size)
    engine.restore(snap, into=slot.session)        # shape / encoding / model gate, then install
    slot.replay, slot.epoch = replay, epoch
    return {"slot": slot.id, "filename": path.name, "position": snap.position,
            "context_epoch": epoch}
