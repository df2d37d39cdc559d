"""Attend before overwrite: what a chunk of queries reads, and when its rows land.

Owns: `stage(plane, start, keys, values) -> Staged`, the key/value view a
chunk's queries attend over plus the `commit()` that stores the chunk.
Does not own: the attention arithmetic (muser.attention) or the plane layouts.

The law: a chunk must never store rows before its own queries have attended,
because on a full ring the store overwrites the oldest rows -- the very rows
the chunk's earliest queries still see.  Ring, capacity 4, len 4, chunk of 3
at position 8 (W = 4):

    ring before   [ 4][ 5][ 6][ 7]        query 8 sees 5 6 7 8
    store first   [ 8][ 9][10][ 7]        rows 5 and 6 are gone: query 8 is wrong
    shadow        [ 4][ 5][ 6][ 7][ 8][ 9][10]   attend here, then store

Three routes, chosen from the plane's state only (so a restored plane takes
the same route as the live one, bit for bit):
  * overwrite: the chunk would evict live rows -> detached shadow in logical
    order (old rows un-rotated, then the new rows); commit stores afterwards.
  * in place: the chunk fits in free slots (every growing plane, a filling
    ring) -> store first (nothing visible is overwritten), read the
    contiguous physical span.  Positions ascend along the span.
  * ring decode: one token on a full ring whose capacity equals its window
    -> store first (the evicted row p - W is not visible to query p), read
    the whole ring in physical order; every row is visible, no mask.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .plane import Plane


@dataclass
class Staged:
    keys: torch.Tensor          # [S, KV, D] (a view or a detached shadow)
    values: torch.Tensor        # [S, KV, D]
    first_position: int         # position of row 0 when `ordered`
    ordered: bool               # rows are positions first_position + arange(S)
    needs_mask: bool            # some query must not see some row
    _plane: Plane
    _start: int
    _new: tuple[torch.Tensor, torch.Tensor] | None   # rows still to store at commit

    def key_positions(self) -> torch.Tensor:
        """int64 [S]; only meaningful when `ordered`."""
        return torch.arange(self.first_position, self.first_position + self.keys.shape[0],
                            device=self.keys.device)

    def commit(self) -> None:
        if self._new is not None:
            self._plane.store(self._start, *self._new)
            self._new = None


def _span(plane: Plane, first_slot: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A view of `count` contiguous slots as [count, KV, D] (no copy)."""
    if plane.head_major:
        return (plane.keys[:, first_slot:first_slot + count].transpose(0, 1),
                plane.values[:, first_slot:first_slot + count].transpose(0, 1))
    return plane.keys[first_slot:first_slot + count], plane.values[first_slot:first_slot + count]


def stage(plane: Plane, start: int, keys: torch.Tensor, values: torch.Tensor,
          real: int | None = None) -> Staged:
    """Prepare attention for a chunk at positions [start, start + T).  keys/values [T, KV, D].

    Only the first `real` rows (default: all) are appended; the rest are
    *scratch* rows -- padding that gives every chunk the same shape (see
    Session) -- which the queries may read but the plane never keeps.
    Continuity and shape are checked before any route is taken, so a refused
    chunk leaves the plane untouched.
    """
    t = plane._check_rows(keys, values, "stage")
    real = t if real is None else real
    plane._check_reservation(start, real)
    window = plane.window
    live = plane.len
    span_first = plane.origin_logical
    fits = (live + t <= plane.capacity and plane.origin_physical + live + t <= plane.capacity
            and start + t <= plane.max_context)

    if fits:
        # In place: nothing live is overwritten; the span [origin_physical, +live+t) is contiguous.
        plane._ensure_storage(start + t)
        plane.store(start, keys[:real], values[:real])
        if real < t:     # scratch rows go to free slots past the live rows, len does not count them
            plane.write_slots(plane.origin_physical + live + real, keys[real:], values[real:])
        k, v = _span(plane, plane.origin_physical, live + t)
        needs_mask = t > 1 or (window is not None and live + t > window)
        return Staged(k, v, span_first, True, needs_mask, plane, start, None)

    if t == 1 and real == 1 and live == plane.capacity and (window is None or plane.capacity <= window):
        # Ring decode at steady state: every row left after the store is visible.
        plane.store(start, keys, values)
        return Staged(plane.keys, plane.values, plane.origin_logical, False, False, plane, start, None)

    # Overwrite: detached shadow in logical order, store after attention.
    shadow_k, shadow_v = plane.shadow_rows(keys, values)             # [live + t, KV, D]
    return Staged(shadow_k, shadow_v, span_first, True, True, plane, start,
                  (keys[:real], values[:real]))
