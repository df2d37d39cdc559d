"""A full-attention layer's growing plane: `GrowingPlane`.

Owns: the head-major storage [KV, allocated, D] and its growth policy
(`reserve`, `allocated`, `min_rows`), and the full half of the sliding/full
difference, reduced to the methods it overrides of `plane.Plane`:
  * `_ensure_storage`: grows the storage (x2, at least `min_rows`) -- the
    base class's hook does nothing;
  * `read_slots` / `slot_views`: physical row == position, one span per head;
  * `check_invariants`: adds origins at 0 and storage matching `allocated`;
  * `allocated_bytes`;
and `writes_ahead = True` (no slot past `end` holds a live row).

A growing plane has capacity == max_context, so `len + count <= capacity`
always holds inside the context and the wrap branch of `append_batch` never
runs: origin_logical == origin_physical == 0 forever and slot(p) == p.  The
ring machinery costs it nothing but one comparison.

Does not own: the bookkeeping fields or any arithmetic that moves them
(`plane.py`; nothing here writes them), the bounded ring (`ring.py`), which
layers get a growing plane (`PLANES` in `__init__.py`: every full layer, and
every layer under the oracle family, the window then only a mask), or
attend-before-overwrite (`staging.py`).
"""
from __future__ import annotations

import torch

from ..errors import CacheError
from .plane import Plane


class GrowingPlane(Plane):
    """A full-attention layer's plane: head-major storage [KV, allocated, D] that grows.

    Storage policy: allocation grows geometrically (x2, at least `min_rows`,
    never past max_context) with a copy, or can be reserved up front with
    `reserve(rows)` (what a CUDA graph needs: static shapes).  Physical row ==
    logical position, so relocation is a plain copy and never changes a bit.
    `window` is None for a true full layer; the oracle backend reuses this
    plane for sliding layers with the window applied only as a mask.
    """

    kind = "growing"
    head_major = True
    writes_ahead = True

    def __init__(self, layer, max_context, kv_heads, head_dim, dtype, device,
                 window: int | None = None, min_rows: int = 256):
        super().__init__(layer, max_context, max_context, kv_heads, head_dim, dtype, device, window)
        self.min_rows = min_rows
        self.keys = torch.zeros((kv_heads, 0, head_dim), dtype=dtype, device=self.device)
        self.values = torch.zeros_like(self.keys)                        # [KV, allocated, D]
        # == keys.shape[1], kept as an int: every decode step asks it for every plane
        self._allocated = 0

    @property
    def allocated(self) -> int:
        return self._allocated

    def reserve(self, rows: int) -> None:
        rows = min(rows, self.max_context)
        if rows <= self.allocated:
            return
        k = torch.zeros((self.kv_heads, rows, self.head_dim), dtype=self.dtype, device=self.device)
        v = torch.zeros_like(k)
        k[:, :self.len].copy_(self.keys[:, :self.len])
        v[:, :self.len].copy_(self.values[:, :self.len])
        self.keys, self.values = k, v
        self._allocated = rows

    def _ensure_storage(self, end_position):
        if end_position > self._allocated:
            self.reserve(max(end_position, 2 * self.allocated, self.min_rows))

    def read_slots(self, first_slot, count):
        # Physical == logical: one span per head.
        k = self.keys[:, first_slot:first_slot + count].transpose(0, 1).contiguous()
        v = self.values[:, first_slot:first_slot + count].transpose(0, 1).contiguous()
        return k, v

    def slot_views(self, first_slot, count):
        # head-major storage: the rows' view is [count, KV, D] over [KV, allocated, D]
        return [(self.keys[:, first_slot:first_slot + count].transpose(0, 1),
                 self.values[:, first_slot:first_slot + count].transpose(0, 1), 0, count)]

    def check_invariants(self) -> None:
        super().check_invariants()
        if (self.origin_logical != 0 or self.origin_physical != 0 or self.len > self.allocated
                or self._allocated != self.keys.shape[1] or self.keys.shape != self.values.shape):
            raise CacheError(f"layer {self.layer}: growing plane invariant broken: "
                             f"{self.metadata()} allocated={self.allocated}, storage "
                             f"{tuple(self.keys.shape)} / {tuple(self.values.shape)}")

    def allocated_bytes(self) -> int:
        return 2 * self.keys.numel() * self.keys.element_size()
