"""Laying a hit back into a session, and holding it: `Installing`, the install side of `CutStore`.

Owns: `install(session, hit)` -- the cut pinned, what RAM lacks read from the disk tier outside
the lock (`_load`: every check; a refused file takes every cut that stood on it out of the disk
tier), the exact `SessionSnapshot` assembled and laid back through `Session.install`, what was
read promoted into RAM -- `install_longest(session, ids)` (lookup + install; 0 on a miss or a bad
file, the caller recomputes) and pins (`pin`, `unpin`, `hold`: nothing a pinned cut needs is
evicted from any tier).  A mixin: the host (`CutStore`, store.py) provides `lock`, `index`,
`disk`, `layout`, `counts`, `longest_prefix`, `_check_session` and `_refuse`.
Does not own: the lookup and the `Hit` record (store.py), assembling the snapshot (objects.py:
`assemble`), a file's checks (disk.py), eviction (index.py) or how a cut is laid back
(muser.cache.snapshot via Session.install).
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Sequence

from ..errors import StoreCorrupt, StoreError, StoreMismatch, StoreMiss
from .objects import Cut, assemble

if TYPE_CHECKING:
    from .store import Hit


class Installing:
    # ------------------------------------------------------------------ install
    def install(self, session, hit: Hit) -> int:
        """Lay `hit` into `session` (replacing its cache); returns the position installed.

        Bitwise the snapshot the cut was put with.  Raises StoreMismatch for a session of another
        model / encoding / layout, StoreMiss when the cut was evicted since the lookup,
        StoreCorrupt when one of its files failed a check (it is gone now); the session is
        unchanged in every case."""
        self._check_session(session)
        if hit.store is not self:
            raise StoreMismatch("that hit belongs to another cut store")
        cut = hit.cut
        with self.lock:
            if self.index.cuts.get(cut.key) is not cut or not self.index.usable(cut):
                raise StoreMiss(f"the cut at position {hit.position} is no longer stored")
            cut.pins += 1
            self.index.touch(cut)
            payload, block_rows = cut.payload, [b.rows for b in cut.blocks]
        loaded = False
        try:
            if payload is None or any(r is None for r in block_rows):
                payload, block_rows = self._load(cut, payload, block_rows)
                loaded = True
            snap = assemble(self.layout, cut, payload, block_rows, hit.tokens)
            session.install(snap)
        finally:
            with self.lock:
                if loaded and self.index.cuts.get(cut.key) is cut:
                    self.index.ram_in(cut, payload, block_rows)    # promote while still pinned
                    self.index.evict("ram")
                    if self.index.over("ram"):
                        self.index.ram_out(cut)
                cut.pins -= 1
        with self.lock:
            self.counts["installs"] += 1
            self.counts["installed_tokens"] += cut.position
        return cut.position

    def _load(self, cut: Cut, payload, block_rows):
        """Read what RAM lacks from disk (every check); a refused file takes its users with it."""
        block_rows = list(block_rows)
        obj = None
        try:
            for j, b in enumerate(cut.blocks):
                if block_rows[j] is None:
                    obj = b
                    block_rows[j] = self.disk.load_block(b)
            if payload is None:
                obj = cut
                payload = self.disk.load_cut(cut)
        except StoreCorrupt as e:
            with self.lock:
                self._refuse(e.path, e.reason)
                users = [c for c in self.index.cuts.values() if obj is c or obj in c.blocks]
                for c in users:
                    self.index.disk_out(c)
            raise
        with self.lock:
            self.counts["disk_loads"] += 1
        return payload, block_rows

    def install_longest(self, session, ids: Sequence[int], limit: int | None = None) -> int:
        """Install the longest stored prefix of `ids` into `session`; 0 when there is none or it
        could not be installed (evicted meanwhile, or a bad file: recompute)."""
        hit = self.longest_prefix(ids, limit)
        if hit is None:
            return 0
        try:
            return self.install(session, hit)
        except StoreMiss:
            return 0

    # ------------------------------------------------------------------ holding
    def pin(self, hit: Hit) -> None:
        """Hold `hit`'s cut: nothing it needs is evicted from any tier until `unpin`."""
        with self.lock:
            if self.index.cuts.get(hit.cut.key) is not hit.cut:
                raise StoreMiss(f"the cut at position {hit.position} is no longer stored")
            hit.cut.pins += 1

    def unpin(self, hit: Hit) -> None:
        with self.lock:
            if hit.cut.pins <= 0:
                raise StoreError(f"the cut at position {hit.position} is not pinned")
            hit.cut.pins -= 1
            self.index.evict("ram")
            self.index.evict("disk")

    @contextlib.contextmanager
    def hold(self, hit: Hit):
        """`with store.hold(hit): ...` -- pinned for the block (see `pin`)."""
        self.pin(hit)
        try:
            yield hit
        finally:
            self.unpin(hit)
