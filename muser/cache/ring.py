"""A sliding-window layer's bounded ring: `RingPlane`.

Owns: the token-major storage [capacity, KV, D] with capacity
`min(max_context, window)`, and the sliding half of the sliding/full difference,
reduced to the methods it overrides of `plane.Plane`:
  * `read_slots` / `slot_views`: a run of slots wraps at `capacity`, so rows
    live in one or two runs (`plane.slot_runs`);
  * `shadow_rows`: staging's detached shadow in one pass into one buffer;
  * `allocated_bytes`: fixed at construction.
`writes_ahead` stays False: the slots past `end` hold the ring's oldest live
rows.  The append arithmetic is the base class's; the ring is the plane kind
whose wrap branch runs.  A ring of capacity 8 after 11 appends (numbers =
positions held):

    physical:  [ 8][ 9][10][ 3][ 4][ 5][ 6][ 7]
                            ^ origin_physical = 3, origin_logical = 3, len = 8

Does not own: the bookkeeping fields or any arithmetic that moves them
(`plane.py`; nothing here writes them), the growing plane (`growing.py`), which
layers get a ring (`PLANES` in `__init__.py`), or attend-before-overwrite
(`staging.py`).
"""
from __future__ import annotations

import torch

from .plane import Plane, slot_runs


class RingPlane(Plane):
    """A sliding layer's bounded ring: token-major storage [capacity, KV, D]."""

    kind = "ring"
    head_major = False

    def __init__(self, layer, window, max_context, kv_heads, head_dim, dtype, device):
        super().__init__(layer, min(max_context, window), max_context, kv_heads, head_dim,
                         dtype, device, window)
        shape = (self.capacity, kv_heads, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=self.device)     # [capacity, KV, D]
        self.values = torch.zeros(shape, dtype=dtype, device=self.device)

    def read_slots(self, first_slot, count):
        if first_slot + count <= self.capacity:          # one run, no wrap (every decode step)
            return (self.keys[first_slot:first_slot + count].clone(),
                    self.values[first_slot:first_slot + count].clone())
        idx = (torch.arange(count, device=self.device) + first_slot) % self.capacity
        return self.keys.index_select(0, idx), self.values.index_select(0, idx)

    def slot_views(self, first_slot, count):
        return [(self.keys[slot:slot + n], self.values[slot:slot + n], off, n)
                for slot, off, n in slot_runs(first_slot, count, self.capacity)]

    def shadow_rows(self, keys, values):
        # One pass into one buffer (the base class un-rotates, then concatenates: two): a small
        # chunk on a full ring copies the whole window here, so this is most of its staging.
        live, t = self.len, keys.shape[0]
        k = self.keys.new_empty((live + t, *self.keys.shape[1:]))           # [len + t, KV, D]
        v = self.values.new_empty((live + t, *self.values.shape[1:]))
        for slot, off, n in slot_runs(self.origin_physical, live, self.capacity):
            k[off:off + n].copy_(self.keys[slot:slot + n])
            v[off:off + n].copy_(self.values[slot:slot + n])
        k[live:].copy_(keys)
        v[live:].copy_(values)
        return k, v

    def allocated_bytes(self) -> int:
        return 2 * self.keys.numel() * self.keys.element_size()
