"""Speculative checkpoints: undo a block of appends without copying the cache.

Owns: `PlaneUndo` (one plane's undo log for one open block) and `Checkpoint`
(the set of them for a session, with commit / rollback).  Does not own: what
a speculative round accepts (muser.engine.speculative).

The two regimes, priced as rollback protocols:

* growing plane -- the block lands in unused storage past `len`; the log is
  the three integers (len, origin_logical, origin_physical).  Rollback to
  `keep` rows is `len = len0 + keep`.  No rows are copied, ever.
* ring plane -- a block can evict live rows.  The log records each eviction
  as if rows were appended one by one: appending q evicts r = q - capacity.
  One eviction per appended row at most, so the log holds at most
  `token_count` rows.  Rollback to `keep` re-derives the metadata as if only
  `keep` rows had been appended and restores every row evicted by a rejected
  position (>= start + keep) that is live again.

Worked example: capacity 4 holding 4 5 6 7, block of 3 at 8, keep 1:

    block      [ 8][ 9][10][ 7]   log: 4 (by 8), 5 (by 9), 6 (by 10)
    keep 1     boundary 9: restore r in [9 - 4, 9) that was evicted -> 5, 6
               [ 8][ 5][ 6][ 7]   live 5 6 7 8, as if only 8 had been appended.

A row of a chunk wider than the ring is "evicted" by a later row of the same
chunk; the staged store never writes it, so the log keeps its bits from the
chunk itself.  That is what makes keep < token_count exact in tiny geometries.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..errors import CheckpointError
from .many import copy_rows
from .plane import Plane


@dataclass
class PlaneUndo:
    start: int
    token_count: int
    mark: tuple[int, int, int]                            # the plane's bookmark() at the checkpoint
    stored: int = 0                                       # rows appended under this checkpoint
    # Runs of evicted rows: (first evicted position r0, keys [m, KV, D], values [m, KV, D]).
    # Row i of a run is position r0 + i, evicted by position r0 + i + capacity.
    # Every position is evicted at most once, so runs never overlap.
    evictions: list[tuple[int, torch.Tensor, torch.Tensor]] = field(default_factory=list)

    def evicted_range(self, plane: Plane, start: int, n: int) -> tuple[int, int]:
        """(first position, count) of the rows already in the plane that `n` rows at `start`
        evict -- what this log must copy before they are written over -- after the checks
        `before_advance` makes (so a batched reader, plane.read_evictions, refuses alike)."""
        if self.stored + n > self.token_count:
            raise CheckpointError(f"layer {plane.layer}: checkpoint at {self.start} allows "
                                  f"{self.token_count} rows, a store would make it {self.stored + n}")
        # Sequentially, appending q evicts r = q - capacity whenever r is still live:
        #   r in [max(oldest, start - capacity), start + n - capacity)
        lo = max(plane.origin_logical, start - plane.capacity)
        return lo, max(0, min(start + n - plane.capacity, start) - lo)

    def before_advance(self, plane: Plane, start: int, n: int,
                       incoming: tuple[torch.Tensor, torch.Tensor] | None,
                       evicted: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """Called by `Plane.advance` after its checks, before the bookkeeping moves.
        `incoming`: the (keys, values) [n, KV, D] the caller will write, or None (a driver that
        writes the rows itself, one at a time: the CUDA graph runner).  `evicted`: the rows of
        `evicted_range`, already copied out by the caller (plane.read_evictions: one copy for
        many planes), else read here."""
        lo, m = self.evicted_range(plane, start, n)
        cap = plane.capacity
        hi = start + n - cap
        own = max(lo, start) < hi                    # rows of this same chunk (never written)
        if own and incoming is None:
            raise CheckpointError(f"layer {plane.layer}: {n} rows at {start} evict rows of their own "
                                  f"chunk (capacity {cap}); the checkpoint needs those rows to log them")
        if m:                                        # rows already in the plane
            if evicted is None:
                evicted = plane.read_slots(plane.slot(lo), m)
            elif evicted[0].shape[0] != m:
                raise CheckpointError(f"layer {plane.layer}: {evicted[0].shape[0]} evicted rows "
                                      f"read, the log needs {m}")
            self.evictions.append((lo, *evicted))
        if own:
            keys, values = incoming
            a, b = max(lo, start) - start, hi - start
            self.evictions.append((start + a, keys[a:b].to(plane.dtype).clone(),
                                   values[a:b].to(plane.dtype).clone()))
        self.stored += n

    def retained_rows(self) -> int:
        return sum(k.shape[0] for _, k, _ in self.evictions)

    def retained_bytes(self) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size()
                   for _, k, v in self.evictions)


class Checkpoint:
    """An open speculative block over every plane of a session."""

    def __init__(self, planes: list[Plane], start_position: int, token_count: int):
        if token_count < 0:
            raise CheckpointError(f"checkpoint token_count must be >= 0, got {token_count}")
        for p in planes:
            if p.undo is not None:
                raise CheckpointError(f"layer {p.layer}: a checkpoint is already open")
            if p.end != start_position:
                raise CheckpointError(f"layer {p.layer}: checkpoint at {start_position} "
                                      f"but the plane ends at {p.end}")
        self.planes = planes
        self.start_position = start_position
        self.token_count = token_count
        self.logs = []
        for p in planes:
            log = PlaneUndo(start_position, token_count, p.bookmark())
            p.open_undo(log)
            self.logs.append(log)
        self.open = True

    def _require_open(self):
        if not self.open:
            raise CheckpointError(f"checkpoint at {self.start_position} is already closed")
        for p, log in zip(self.planes, self.logs):
            if p.undo is not log:
                raise CheckpointError(f"layer {p.layer}: checkpoint was detached (reset or restore?)")

    def commit(self) -> None:
        """Keep everything the block appended; drop the log."""
        self._require_open()
        for p in self.planes:
            p.close_undo()
        self.open = False

    def rollback(self, keep: int) -> None:
        """Return every plane to `start_position + keep`, bitwise as if only `keep` rows were appended."""
        self._require_open()
        # Planes can disagree only after a forward failed half-way through the
        # layers; rolling back to what every plane holds is still exact.
        stored = min((log.stored for log in self.logs), default=0)
        if not 0 <= keep <= stored:
            raise CheckpointError(f"rollback keep must be in [0, {stored}], got {keep}")
        boundary = self.start_position + keep
        dst, src = [], []                            # every plane's restores: one copy at the end
        for p, log in zip(self.planes, self.logs):
            # Metadata first: back to the checkpoint, then re-reserve `keep` rows.
            # The slot map (origin_physical - origin_logical) mod capacity never changes,
            # so slots computed below agree with the state we rebuild.
            p.close_undo()
            p.rewind(log.mark)
            p.advance(keep)
            # Restore what rejected positions (>= boundary) evicted and is live again:
            # r in [boundary - capacity, boundary).  Those slots are distinct, so order is free.
            for r0, k, v in log.evictions:
                lo, hi = max(r0, boundary - p.capacity), min(r0 + k.shape[0], boundary)
                for kd, vd, off, n in p.slot_views(p.slot(lo), max(0, hi - lo)):
                    a = lo - r0 + off
                    dst += [kd, vd]
                    src += [k[a:a + n], v[a:a + n]]
        copy_rows(dst, src)
        self.open = False

    def retained_rows(self) -> list[int]:
        return [log.retained_rows() for log in self.logs]

    def retained_bytes(self) -> list[int]:
        return [log.retained_bytes() for log in self.logs]
