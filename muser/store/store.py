"""`CutStore`: exact cuts of sessions, shared by prefix, in a RAM tier and an optional disk tier.

Owns: the public API's home -- `CutStore`, with `put(session)`, `longest_prefix(ids)`, `evict`,
`flush`, `close`, `stats` here and `install(session, hit)`, `install_longest(session, ids)`,
`pin` / `unpin` / `hold` from its `Installing` mixin (install.py) -- the `Hit` a lookup returns,
the lock every index change happens under, the gate that refuses a session of another model,
encoding or plane layout (`StoreMismatch`), and what a bad disk file costs (`StoreCorrupt`:
logged, counted, removed, raised to the caller, who recomputes).  Does not own: laying a hit
back into a session, reading what RAM lacks from disk for it, and pins (moved to install.py),
the policy (index.py), bytes on disk (disk.py, writer.py) or how a cut is laid back
(muser.cache.snapshot via Session.install).

What a stored cut holds (objects.py): the ring windows (last min(p, W) rows of each sliding
layer) and the growing rows past its last whole block; the growing rows of whole blocks are
`Block`s shared by every cut on the same ids.  Installing a hit (install.py) assembles exactly
the `SessionSnapshot` the session had when it was put, and installs that through the snapshot
gate -- so it is bitwise the same as restoring that session's snapshot.

Threads: any.  `put` and `install` copy tensors under the lock (a few ms for a 2k-token cut);
`install` reads disk files outside it, with the cut pinned so that nothing it needs is evicted.
"""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Sequence

from ..errors import StoreError, StoreMismatch
from . import chain as ch
from .disk import DiskTier
from .index import Index
from .install import Installing
from .objects import Block, Cut, Layout, block_matches, nbytes, read_block, read_cut
from .writer import Writer

log = logging.getLogger("muser.store")
DEFAULT_BLOCK = 64


def default_ram_bytes() -> int:
    """A tenth of physical memory, at most 8 GiB (1 GiB when the size is unknown)."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 30
    return max(64 << 20, min(total // 10, 8 << 30))


@dataclass(frozen=True)
class Hit:
    """A stored cut whose ids are a prefix of the looked-up ids: install it with `install`."""

    position: int
    tier: str                          # "ram" | "disk": where its bytes are now
    tokens: tuple[int, ...] = field(repr=False)
    cut: Cut = field(repr=False, compare=False)
    store: "CutStore" = field(repr=False, compare=False)


class CutStore(Installing):
    def __init__(self, engine, ram_bytes: int | None = None, disk_dir=None, disk_bytes: int | None = None,
                 key: bytes | str | None = None, block_size: int = DEFAULT_BLOCK):
        ram_bytes = default_ram_bytes() if ram_bytes is None else int(ram_bytes)
        if ram_bytes < 0 or block_size < 1 or (disk_bytes is not None and disk_bytes < 0):
            raise StoreError(f"ram_bytes and disk_bytes must be >= 0 and block_size >= 1, got "
                             f"{ram_bytes}, {disk_bytes}, {block_size}")
        self.layout = Layout.of(engine.new_session())
        self.block_size = block_size
        self.namespace = ch.namespace(self.layout.fingerprint, str(self.layout.encoding),
                                      self.layout.key(), block_size)
        self.lock = threading.RLock()
        self.counts = {k: 0 for k in ("lookups", "hits", "hit_tokens", "installs", "installed_tokens",
                                      "puts", "puts_existing", "puts_rejected", "put_bytes",
                                      "corrupt", "disk_writes", "disk_errors", "disk_loads")}
        self.degraded = False
        self.disk = self.writer = None
        self.index = Index(block_size, ch.root(self.namespace), ram_bytes, disk_bytes, self._remove_file)
        if disk_dir is not None:
            key = key.encode("utf-8") if isinstance(key, str) else key
            self.disk = DiskTier(disk_dir, self.namespace, self.layout, block_size, key)
            self._adopt(self.disk.scan(self._refuse))
            self.writer = Writer(self)

    # ------------------------------------------------------------------ gates
    def _check_session(self, session) -> None:
        got = Layout.of(session)
        if got != self.layout or got.fingerprint != self.layout.fingerprint:
            what = ("encoding" if got.encoding != self.layout.encoding else
                    "model" if got.fingerprint != self.layout.fingerprint else "plane layout")
            raise StoreMismatch(f"cut store {what} expected {self._describe(self.layout, what)}, "
                                f"found {self._describe(got, what)}")

    @staticmethod
    def _describe(layout: Layout, what: str) -> str:
        if what == "encoding":
            return str(layout.encoding)
        if what == "model":
            fp = layout.fingerprint
            return f"{fp.get('architecture')} weights {str(fp.get('weights_digest'))[:12]}.."
        return f"{len(layout.planes)} planes of [{layout.kv_heads}, {layout.head_dim}] {layout.dtype}"

    def _remove_file(self, obj) -> None:
        if self.disk is not None:
            self.disk.remove(obj)

    def _refuse(self, path, error) -> None:
        self.counts["corrupt"] += 1
        log.warning("cut store: refused %s (%s); removed, the prefix will be recomputed",
                    getattr(path, "name", path), error)
        try:
            os.unlink(path)
        except OSError:
            pass

    def _adopt(self, scanned) -> None:
        for cut, size, _mtime, block_sizes in sorted(scanned.cuts, key=lambda c: c[2]):
            self.index.add_cut(cut)
            for b in cut.blocks:
                self.index.block_written(b, block_sizes[id(b)])
            self.index.disk_in(cut, size)
        self.index.evict("disk")

    # ------------------------------------------------------------------ put
    def put(self, session) -> Hit | None:
        """Store the cut at the session's position; returns its hit, or None when nothing was
        stored (position 0, or the cut alone exceeds the RAM budget with no disk tier)."""
        self._check_session(session)
        if getattr(session, "_open", None) is not None:
            raise StoreError("cannot store a session with an open speculative checkpoint")
        p, B = session.position, self.block_size
        ids = [int(t) for t in session.tokens[:p]]
        if len(ids) != p or any(t < 0 for t in ids):
            raise StoreError(f"cannot store a cut without its token ids: position {p}, "
                             f"{sum(t < 0 for t in ids)} unknown of {len(ids)} ids")
        if p == 0:
            return None
        k = p // B
        hashes = ch.chain(self.index.root, ids, B, k)
        key = ch.cut_key(hashes[k], ids[k * B:])
        with self.lock:
            self.counts["puts"] += 1
            old = self.index.cuts.get(key)
            if old is not None:
                self.counts["puts_existing"] += 1
                self.index.touch(old)
                return self._hit(old, ids) if self.index.usable(old) else None
            blocks, rows = [], []
            for i in range(k):
                b, r = self._block(session, hashes[i + 1], hashes[i], i, ids)
                blocks.append(b)
                rows.append(r)
            payload = read_cut(session, k * B)
            cut = Cut(key, hashes[k], p, tuple(ids[k * B:]), tuple(blocks), nbytes(payload))
            new = sum(b.nbytes for b in blocks if b.rows is None) + cut.nbytes
            writing = self.writer is not None and not self.degraded
            fits = new <= self.index.budget["ram"]
            if not fits and not writing:
                self.counts["puts_rejected"] += 1       # would evict everything and still not fit
                return None
            self.index.add_cut(cut)
            if fits:
                cut.pins += 1
                self.index.ram_in(cut, payload, rows)
                self.index.evict("ram")
                cut.pins -= 1
            if writing:                                 # disk only, when over the RAM budget
                self.index.write_started(cut)
                self.writer.enqueue(cut, payload, [None if b.on_disk else r for b, r in zip(blocks, rows)])
            if self.index.over("ram"):                  # pinned cuts left no room
                self.index.ram_out(cut)
            if not self.index.usable(cut) and not writing:
                self.counts["puts_rejected"] += 1
                return None
            self.counts["put_bytes"] += new
            return self._hit(cut, ids)

    def _block(self, session, chain: bytes, parent: bytes, i: int, ids) -> tuple[Block, tuple]:
        """The stored variant of block i holding exactly the session's rows, or a new one."""
        B = self.block_size
        fresh = None
        for b in self.index.variants(chain):
            if b.rows is not None:
                if block_matches(session, b, B):
                    return b, b.rows
            elif b.digest is not None:             # only on disk: compare digests, read no file
                fresh = fresh or read_block(session, i, B)
                if ch.content_digest([t for c in fresh for t in (c.keys, c.values)]) == b.digest:
                    return b, fresh
        fresh = fresh or read_block(session, i, B)
        return Block(chain, parent, i, tuple(ids[i * B:(i + 1) * B]), nbytes(fresh)), fresh

    def _hit(self, cut: Cut, ids) -> Hit:
        return Hit(cut.position, "ram" if cut.payload is not None else "disk",
                   tuple(ids[:cut.position]), cut, self)

    # ------------------------------------------------------------------ lookup
    def longest_prefix(self, ids: Sequence[int], limit: int | None = None, record: bool = True) -> Hit | None:
        """The longest stored cut whose ids are a prefix of `ids`, at most `limit` positions
        (default len(ids); a server passes len(ids) - 1 to keep one token to compute).
        `record=False` peeks without counting a lookup (placement scoring)."""
        ids = [int(t) for t in ids]
        limit = len(ids) if limit is None else limit
        with self.lock:
            cut = self.index.longest(ids, limit)
            if record:
                self.counts["lookups"] += 1
                if cut is not None:
                    self.counts["hits"] += 1
                    self.counts["hit_tokens"] += cut.position
            return None if cut is None else self._hit(cut, ids)

    # ------------------------------------------------------------------ housekeeping
    def evict(self, nbytes: int | None = None, tier: str = "ram") -> int:
        """Evict unpinned cuts (leaves first, least recently used first) until `nbytes` of `tier`
        were freed, or all of them (None).  Returns the number of cuts evicted."""
        with self.lock:
            start = self.index.used[tier]
            until = (lambda: False) if nbytes is None else (lambda: start - self.index.used[tier] >= nbytes)
            return self.index.evict(tier, until)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait for queued disk writes (True when none is left)."""
        return True if self.writer is None else self.writer.flush(timeout)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

    def stats(self) -> dict:
        with self.lock:
            ix = self.index
            cuts = list(ix.cuts.values())
            blocks = [b for v in ix.blocks.values() for b in v]
            return {**self.counts,
                    "block_size": self.block_size,
                    "bytes": dict(ix.used), "budget": dict(ix.budget), "evictions": dict(ix.evictions),
                    "cuts": {"ram": sum(c.payload is not None for c in cuts),
                             "disk": sum(c.on_disk for c in cuts), "total": len(cuts)},
                    "blocks": {"ram": sum(b.rows is not None for b in blocks),
                               "disk": sum(b.on_disk for b in blocks), "total": len(blocks)},
                    "disk": None if self.disk is None else str(self.disk.dir),
                    "disk_degraded": self.degraded,
                    "disk_pending": 0 if self.writer is None else self.writer.pending()}

    def check_invariants(self) -> None:
        with self.lock:
            self.index.check_invariants()
