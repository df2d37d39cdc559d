"""The store's index: which cuts and blocks exist, where they reside, and who may be evicted.

Owns: the maps (blocks by chain -> variants, cuts by key and by base chain), the prefix relation
between stored cuts (ancestors / descendants), residency per tier (RAM: tensors present; disk: a
file present) with byte accounting, reference counts and the eviction policy.  Not thread-safe
by itself: `CutStore` calls it under its lock.  Does not own tensors' contents (objects.py),
files (disk.py: the index asks `remove_file` to delete one) or the public API (store.py).

Invariants (`check_invariants`):
  a block is in the index iff some indexed cut stands on it (`users`)
  block.ram_refs  == RAM-resident cuts standing on it; its rows are held iff ram_refs > 0
  block.disk_refs == disk-resident cuts standing on it; its file exists only while
                     disk_refs > 0 or a write of a cut standing on it is in flight (`writers`)
  a RAM-resident cut's blocks all hold rows; a disk-resident cut's blocks all have files
  ram_used / disk_used == the bytes of what each tier holds
  a cut is in the index iff it is resident somewhere or a disk write of it is in flight

Eviction, per tier, whenever the tier is over its budget: the least recently used *leaf* (a
resident cut that no other resident cut extends) that is not pinned; only when every unpinned
cut has a resident descendant, the least recently used unpinned cut.  Evicting a cut never
makes another cut unusable: blocks are reference-counted and leave a tier only with their last
user there -- a shared prefix block stays while any cut needs it (no tombstones).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Sequence

from . import chain as ch
from .objects import Block, Cut

TIERS = ("ram", "disk")


class Index:
    def __init__(self, block_size: int, root: bytes, ram_budget: int, disk_budget: int | None,
                 remove_file: Callable[[object], None]):
        self.block_size = block_size
        self.root = root
        self.budget = {"ram": ram_budget, "disk": disk_budget}
        self.used = {"ram": 0, "disk": 0}
        self.evictions = {"ram": 0, "disk": 0}
        self.remove_file = remove_file
        self.blocks: dict[bytes, list[Block]] = {}
        self.users: dict[int, int] = {}              # id(block) -> indexed cuts standing on it
        self.cuts: dict[bytes, Cut] = {}
        self.by_base: dict[bytes, list[Cut]] = {}
        self.through: dict[bytes, set] = {}          # block chain -> cuts standing on that block
        self.lru: OrderedDict[bytes, Cut] = OrderedDict()   # least recently used first
        self._clock = 0

    # ------------------------------------------------------------------ lookups
    def touch(self, cut: Cut) -> None:
        self._clock += 1
        cut.last_used = self._clock
        self.lru.move_to_end(cut.key)

    @staticmethod
    def usable(cut: Cut) -> bool:
        return cut.payload is not None or cut.on_disk

    def longest(self, ids: Sequence[int], limit: int) -> Cut | None:
        """The usable cut with the most positions <= limit whose ids are a prefix of `ids`."""
        B, h, best = self.block_size, self.root, None
        limit = min(limit, len(ids))
        i = 0
        while True:
            for c in self.by_base.get(h, ()):
                if (c.position <= limit and self.usable(c) and (best is None or c.position > best.position)
                        and tuple(ids[i * B:c.position]) == c.tail):
                    best = c
            if (i + 1) * B > limit:
                return best
            h = ch.link(h, ids[i * B:(i + 1) * B])
            if h not in self.blocks:
                return best
            i += 1

    def variants(self, chain: bytes) -> list[Block]:
        return self.blocks.get(chain, [])

    # ------------------------------------------------------------------ membership
    def add_cut(self, cut: Cut) -> None:
        """Register `cut` (its blocks may be new); residency flags are set by ram_in / disk_in."""
        for b in cut.blocks:
            if id(b) not in self.users:
                self.blocks.setdefault(b.chain, []).append(b)
                self.users[id(b)] = 0
            self.users[id(b)] += 1
        for h in [self.root] + [b.chain for b in cut.blocks]:
            for other in self.by_base.get(h, ()):
                if cut.extends(other, self.block_size):
                    cut.ancestors.add(other)
                    other.descendants.add(cut)
        # a cut extending this one stands on its base block (or, for a base at the root, anywhere)
        maybe = self.through.get(cut.base, ()) if cut.blocks else self.cuts.values()
        for other in list(maybe) + self.by_base.get(cut.base, []):
            if other.extends(cut, self.block_size):
                cut.descendants.add(other)
                other.ancestors.add(cut)
        self.cuts[cut.key] = cut
        self.by_base.setdefault(cut.base, []).append(cut)
        for b in cut.blocks:
            self.through.setdefault(b.chain, set()).add(cut)
        self.lru[cut.key] = cut
        self.touch(cut)

    def _drop_cut(self, cut: Cut) -> None:
        """Unregister a cut resident nowhere (and blocks nobody stands on any more)."""
        del self.cuts[cut.key]
        self.lru.pop(cut.key, None)
        self.by_base[cut.base].remove(cut)
        if not self.by_base[cut.base]:
            del self.by_base[cut.base]
        for b in cut.blocks:
            users = self.through[b.chain]
            users.discard(cut)
            if not users:
                del self.through[b.chain]
        for a in cut.ancestors:
            a.descendants.discard(cut)
        for d in cut.descendants:
            d.ancestors.discard(cut)
        cut.ancestors, cut.descendants = set(), set()
        for b in cut.blocks:
            self.users[id(b)] -= 1
            if self.users[id(b)] == 0:
                del self.users[id(b)]
                self.blocks[b.chain].remove(b)
                if not self.blocks[b.chain]:
                    del self.blocks[b.chain]

    def forget_if_homeless(self, cut: Cut) -> None:
        if cut.key in self.cuts and cut.payload is None and not cut.on_disk and not cut.writing:
            self._drop_cut(cut)

    # ------------------------------------------------------------------ residency
    def ram_in(self, cut: Cut, payload, block_rows) -> None:
        """Make `cut` RAM-resident with `payload`; block_rows[j] fills blocks[j] if it has none."""
        if cut.payload is not None:
            return
        cut.payload = payload
        self.used["ram"] += cut.nbytes
        for b, rows in zip(cut.blocks, block_rows):
            if b.ram_refs == 0 and b.rows is None:
                b.rows = rows
                self.used["ram"] += b.nbytes
            b.ram_refs += 1

    def ram_out(self, cut: Cut) -> None:
        if cut.payload is None:
            return
        cut.payload = None
        self.used["ram"] -= cut.nbytes
        for b in cut.blocks:
            b.ram_refs -= 1
            if b.ram_refs == 0 and b.rows is not None:
                b.rows = None
                self.used["ram"] -= b.nbytes
        self.forget_if_homeless(cut)

    def block_written(self, b: Block, file_bytes: int) -> None:
        if not b.on_disk:
            b.on_disk, b.disk_bytes = True, file_bytes
            self.used["disk"] += file_bytes

    def disk_in(self, cut: Cut, file_bytes: int) -> None:
        """`cut`'s file exists, and so do all its blocks' (block_written)."""
        if cut.on_disk:
            return
        cut.on_disk, cut.disk_bytes = True, file_bytes
        self.used["disk"] += file_bytes
        for b in cut.blocks:
            b.disk_refs += 1

    def disk_out(self, cut: Cut) -> None:
        if not cut.on_disk:
            return
        cut.on_disk = False
        self.used["disk"] -= cut.disk_bytes
        self.remove_file(cut)
        for b in cut.blocks:
            b.disk_refs -= 1
            self._drop_block_file(b)
        self.forget_if_homeless(cut)

    def _drop_block_file(self, b: Block) -> None:
        """A block file stays while a disk-resident cut stands on it or a write on it is in flight."""
        if b.on_disk and b.disk_refs == 0 and b.writers == 0:
            b.on_disk = False
            self.used["disk"] -= b.disk_bytes
            self.remove_file(b)

    def write_started(self, cut: Cut) -> None:
        cut.writing = True
        for b in cut.blocks:
            b.writers += 1

    def write_ended(self, cut: Cut) -> None:
        """After `disk_in` (success) or without it (failure): unused block files go."""
        if not cut.writing:
            return
        cut.writing = False
        for b in cut.blocks:
            b.writers -= 1
            self._drop_block_file(b)
        self.forget_if_homeless(cut)

    # ------------------------------------------------------------------ eviction
    def _victim(self, tier: str) -> Cut | None:
        resident = (lambda c: c.payload is not None) if tier == "ram" else (lambda c: c.on_disk)
        fallback = None
        for c in self.lru.values():                      # least recently used first
            if not resident(c) or c.pins:
                continue
            if not any(resident(d) for d in c.descendants):
                return c
            fallback = fallback or c
        return fallback

    def over(self, tier: str) -> bool:
        budget = self.budget[tier]
        return budget is not None and self.used[tier] > budget

    def evict(self, tier: str, until: Callable[[], bool] | None = None) -> int:
        """Evict from `tier` until it is within budget (or `until()`); returns cuts evicted."""
        done = until or (lambda: not self.over(tier))
        n = 0
        while not done():
            victim = self._victim(tier)
            if victim is None:
                break
            (self.ram_out if tier == "ram" else self.disk_out)(victim)
            self.evictions[tier] += 1
            n += 1
        return n

    # ------------------------------------------------------------------ checks
    def check_invariants(self) -> None:
        ram = disk = 0
        seen: dict[int, Block] = {}
        for c in self.cuts.values():
            assert self.usable(c) or c.writing, f"homeless cut at {c.position}"
            if c.payload is not None:
                ram += c.nbytes
                assert all(b.rows is not None for b in c.blocks), "RAM cut on a block without rows"
            if c.on_disk:
                disk += c.disk_bytes
                assert all(b.on_disk for b in c.blocks), "disk cut on a block without a file"
            for b in c.blocks:
                seen[id(b)] = b
            assert c.position == len(c.blocks) * self.block_size + len(c.tail)
        for b in seen.values():
            assert b in self.blocks.get(b.chain, []), "block missing from the index"
            assert b.ram_refs == sum(1 for c in self.cuts.values() if c.payload is not None and b in c.blocks)
            assert b.disk_refs == sum(1 for c in self.cuts.values() if c.on_disk and b in c.blocks)
            assert b.writers == sum(1 for c in self.cuts.values() if c.writing and b in c.blocks)
            assert (b.rows is not None) == (b.ram_refs > 0), "block rows held without a RAM user"
            assert not b.on_disk or b.disk_refs > 0 or b.writers > 0, "orphan block file"
            assert b.disk_refs == 0 or b.on_disk, "disk cut on a block without a file"
            ram += b.nbytes if b.rows is not None else 0
            disk += b.disk_bytes if b.on_disk else 0
        assert sum(len(v) for v in self.blocks.values()) == len(seen) == len(self.users)
        assert sum(len(v) for v in self.through.values()) == sum(len(c.blocks) for c in self.cuts.values())
        assert all(c in self.through[b.chain] for c in self.cuts.values() for b in c.blocks)
        assert (ram, disk) == (self.used["ram"], self.used["disk"]), (ram, disk, self.used)
