"""What the store holds: shared prefix blocks and cuts, and how they leave and re-enter a session.

Owns: `Layout` (a session's planes as the store sees them), `Block` (one block of B positions of
every *prefix plane* -- a growing plane, whose cut holds all rows [0, p)), `Cut` (a cut's own
bytes: every *window plane*'s last min(p, capacity) rows -- the ring windows -- plus the prefix
planes' rows past the last whole block, and the blocks it stands on), `read_block` / `read_cut`
(rows out of live planes) and `assemble` (blocks + cut -> the `SessionSnapshot` that
`Session.install` gates and lays back, so installing from the store *is* restoring a snapshot).
Does not own: the index, budgets and eviction (index.py), files (disk.py), the public API
(store.py).  The plane kinds are the cut contract's (muser.cache.snapshot): a growing plane's
cut is a plain prefix, a ring plane's cut is a window; nothing here asks which layer is sliding.

Why a block is (chain, rows) and not chain alone: two computations of the same ids in different
chunk shapes can give different bits (until every path is chunk-invariant); a cut must be
installed with exactly the rows it was taken with, so unequal rows become a second variant of the
block instead of silently mixing two computations.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..cache.snapshot import Encoding, PlaneCut, SessionSnapshot


@dataclass(frozen=True)
class PlaneInfo:
    layer: int
    kind: str                  # "ring" (window plane) | "growing" (prefix plane)
    window: int | None
    capacity: int


@dataclass(frozen=True)
class Layout:
    planes: tuple[PlaneInfo, ...]
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    encoding: Encoding
    fingerprint: dict = field(hash=False, compare=False)

    @classmethod
    def of(cls, session) -> "Layout":
        ps = session.planes
        return cls(tuple(PlaneInfo(p.layer, p.kind, p.window, p.capacity) for p in ps),
                   ps[0].kv_heads, ps[0].head_dim, ps[0].dtype, session.engine.encoding,
                   dict(session.engine.fingerprint))

    def key(self) -> list[tuple]:
        """What the namespace hashes besides model and encoding: the plane geometry."""
        return [(p.layer, p.kind, p.window, p.capacity) for p in self.planes] + \
            [("rows", self.kv_heads, self.head_dim, str(self.dtype))]

    @property
    def prefix(self) -> tuple[PlaneInfo, ...]:
        return tuple(p for p in self.planes if p.kind == "growing")

    def row_bytes(self) -> int:
        return 2 * self.kv_heads * self.head_dim * self.dtype.itemsize

    def window_rows(self, position: int) -> int:
        return sum(min(position, p.capacity) for p in self.planes if p.kind != "growing")


@dataclass(eq=False)
class Block:
    """Rows [index*B, (index+1)*B) of every prefix plane, after the ids that `chain` names."""

    chain: bytes
    parent: bytes
    index: int
    ids: tuple[int, ...]
    nbytes: int
    rows: tuple[PlaneCut, ...] | None = None   # RAM tier: one per prefix plane, [B, KV, D] each
    digest: str | None = None                  # content digest, known once written or loaded
    on_disk: bool = False                      # its file exists (and is counted)
    disk_bytes: int = 0                        # its file's size
    ram_refs: int = 0                          # RAM-resident cuts standing on it
    disk_refs: int = 0                         # disk-resident cuts standing on it
    writers: int = 0                           # cuts standing on it with a disk write in flight

    def tensors(self):
        return [t for c in self.rows for t in (c.keys, c.values)]


@dataclass(eq=False)
class Cut:
    """A cut's own bytes at `position`: ring windows + prefix rows past the last whole block."""

    key: bytes
    base: bytes                                # chain of the last whole block (root if none)
    position: int
    tail: tuple[int, ...]                      # ids [len(blocks)*B, position)
    blocks: tuple[Block, ...]
    nbytes: int
    payload: tuple[PlaneCut, ...] | None = None   # RAM tier: one per plane, layout order
    on_disk: bool = False
    disk_bytes: int = 0
    writing: bool = False                      # a disk write is queued or running
    last_used: int = 0
    pins: int = 0
    ancestors: set = field(default_factory=set)     # stored cuts that are proper prefixes of it
    descendants: set = field(default_factory=set)   # stored cuts it is a proper prefix of

    def tokens(self) -> tuple[int, ...]:
        return tuple(i for b in self.blocks for i in b.ids) + self.tail

    def extends(self, other: "Cut", block_size: int) -> bool:
        """Whether `other`'s ids are a proper prefix of this cut's."""
        if other.position >= self.position or other is self:
            return False
        k = len(other.blocks)
        if k > len(self.blocks) or (k and self.blocks[k - 1].chain != other.base):
            return False
        if not other.tail:
            return True
        nxt = self.blocks[k].ids if k < len(self.blocks) else self.tail
        return tuple(nxt[:len(other.tail)]) == other.tail


# ------------------------------------------------------------------------- rows out of planes
def _cpu(t: torch.Tensor) -> torch.Tensor:
    return t.cpu()                      # no copy when it is already there


def _rows(plane, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    k, v = plane.read_slots(plane.slot(start), count)         # [count, KV, D] each, a copy
    return _cpu(k), _cpu(v)


def read_block(session, index: int, block_size: int) -> tuple[PlaneCut, ...]:
    """Rows of block `index` of every prefix plane of `session` (which holds them)."""
    start = index * block_size
    out = []
    for p in session.planes:
        if p.kind == "growing":
            k, v = _rows(p, start, block_size)
            out.append(PlaneCut(p.layer, p.kind, p.window, start, block_size, k, v))
    return tuple(out)


def block_matches(session, block: Block, block_size: int) -> bool:
    """Whether `session` holds exactly `block`'s rows (bitwise)."""
    start = block.index * block_size
    growing = [p for p in session.planes if p.kind == "growing"]
    for p, c in zip(growing, block.rows):
        k, v = _rows(p, start, block_size)
        if not (torch.equal(k, c.keys) and torch.equal(v, c.values)):
            return False
    return True


def read_cut(session, tail_start: int) -> tuple[PlaneCut, ...]:
    """Every plane's own part of the cut at the session's position: a ring plane's window, a
    growing plane's rows [tail_start, position)."""
    position = session.position
    out = []
    for p in session.planes:
        if p.kind == "growing":
            k, v = _rows(p, tail_start, position - tail_start)
            out.append(PlaneCut(p.layer, p.kind, p.window, tail_start, position - tail_start, k, v))
        else:
            k, v = p.logical_rows()
            out.append(PlaneCut(p.layer, p.kind, p.window, p.origin_logical, p.len, _cpu(k), _cpu(v)))
    return tuple(out)


def nbytes(cuts) -> int:
    return sum(c.nbytes for c in cuts)


# ------------------------------------------------------------------------- back into a session
def assemble(layout: Layout, cut: Cut, payload, block_rows, tokens) -> SessionSnapshot:
    """The complete cut at `cut.position`: prefix planes = blocks + tail, window planes as taken.

    `block_rows[j]` are the rows of `cut.blocks[j]` (from RAM or just read from disk).
    """
    planes, j = [], 0                    # j: index among the prefix planes (a block's rows)
    for info, own in zip(layout.planes, payload):
        if info.kind == "growing":
            ks = [rows[j].keys for rows in block_rows] + [own.keys]
            vs = [rows[j].values for rows in block_rows] + [own.values]
            k = torch.cat(ks) if len(ks) > 1 else own.keys      # [position, KV, D]
            v = torch.cat(vs) if len(vs) > 1 else own.values
            planes.append(PlaneCut(info.layer, info.kind, info.window, 0, cut.position, k, v))
            j += 1
        else:
            planes.append(own)
    return SessionSnapshot(cut.position, layout.encoding, tuple(planes), tuple(tokens),
                           dict(layout.fingerprint))
