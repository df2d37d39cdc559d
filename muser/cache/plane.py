"""One layer's K/V storage and its bookkeeping: the base `Plane` both plane kinds share.

Owns: the five bookkeeping fields and their invariants, the shared append
arithmetic (`append_batch`), `advance(n)` -- the one way bookkeeping moves
forward, whichever driver runs the step (`store` here, many.py's lockstep and
batched stores, a checkpoint replaying the rows it keeps) --,
`bookmark` / `rewind` (metadata back to an earlier state), writing rows
(`store`), reading them in logical order (`logical_rows`) and laying them back
with the rotation rebuilt (`install`), the layout hooks a plane kind fills in
(`read_slots`, `slot_views`, `_ensure_storage`) and `slot_runs`.  No code
outside this file writes a plane's fields (the plane kinds do not either;
lockstep planes take a leader's through `follow`).  Does not own: the two
storage layouts -- the sliding layer's bounded ring (`ring.py`, `RingPlane`)
and the full layer's growing plane (`growing.py`, `GrowingPlane`) -- or which
layer gets which (`PLANES` in `__init__.py`); attention (muser.attention), the
attend-before-overwrite protocol (`staging.py`), undo logs (`checkpoint.py`),
many planes at once (`many.py`) or the cut contract (`snapshot.py`).

Physical placement is never derived from an absolute position.  It comes
from the origins:

    slot(p) = (origin_physical + (p - origin_logical)) % capacity

A ring wraps (`ring.py` draws one after 11 appends); a growing plane never
does, so its slot(p) == p (`growing.py`).
"""
from __future__ import annotations

import torch

from ..errors import CacheDiscontinuity, CacheError, CacheOverflow, CheckpointError


def slot_runs(first_slot: int, count: int, capacity: int) -> list[tuple[int, int, int]]:
    """Split `count` consecutive slots starting at `first_slot` (mod capacity) into
    at most two contiguous runs: [(slot_start, offset_in_range, length), ...]."""
    if count == 0:
        return []
    head = min(count, capacity - first_slot)
    runs = [(first_slot, 0, head)]
    if count > head:
        runs.append((0, head, count - head))
    return runs


class Plane:
    """Bookkeeping + append arithmetic shared by both plane kinds.

    Invariants (checked by `check_invariants`):
      0 <= len <= capacity                  live rows
      origin_logical >= 0                   position of the oldest live row
      0 <= origin_physical < capacity       slot of that row (0 when capacity == 0)
      origin_logical + len <= max_context   the next position to append
      growing: origin_logical == origin_physical == 0
    """

    kind: str = "?"
    head_major: bool = False

    def __init__(self, layer: int, capacity: int, max_context: int, kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device, window: int | None):
        if capacity < 1 or max_context < capacity:
            raise CacheError(f"layer {layer}: capacity {capacity} must be in [1, max_context={max_context}]")
        self.layer = layer
        self.capacity = capacity
        self.max_context = max_context
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        self.window = window            # attention span applied as a mask (None = unbounded)
        self.len = 0
        self.origin_logical = 0
        self.origin_physical = 0
        self.undo = None                # an open checkpoint.PlaneUndo, or None

    # ------------------------------------------------------------------ arithmetic
    @property
    def end(self) -> int:
        """The next position to append (== origin_logical + len)."""
        return self.origin_logical + self.len

    def slot(self, position: int) -> int:
        return (self.origin_physical + (position - self.origin_logical)) % self.capacity

    def _check_reservation(self, start_position: int, count: int) -> None:
        if start_position != self.end:
            raise CacheDiscontinuity(self.layer, self.end, start_position)
        if count < 0:
            raise CacheError(f"layer {self.layer}: cannot reserve {count} rows")
        if start_position + count > self.max_context:
            raise CacheOverflow(self.layer, self.max_context, start_position + count)

    def append_batch(self, start_position: int, count: int) -> tuple[int, int]:
        """Reserve rows for positions [start, start + count); metadata only.

        Returns (source_first, source_count): rows [source_first, count) of the
        chunk still lie inside the plane after the reservation.  Worked example,
        capacity 2,048, len 1,900, chunk of 512 at position 1,900:
            total 2,412 > 2,048 -> overflow 364: origin_logical 0 -> 364,
            origin_physical 0 -> 364, len -> 2,048; source_first = max(0, 364 - 1,900) = 0
            -> (0, 512): every row of the chunk survives.
        A chunk wider than the ring (count > capacity) loses its own head:
            capacity 4, empty, chunk of 6 at 0 -> origin_logical 2 -> (2, 4).
        """
        self._check_reservation(start_position, count)
        return self._reserve(start_position, count)

    def _reserve(self, start_position: int, count: int) -> tuple[int, int]:
        """append_batch after its checks (advance makes them once, not twice: a batched decode
        step runs this for every session and plane group)."""
        self._ensure_storage(start_position + count)
        total = self.len + count
        if total <= self.capacity:
            self.len = total
        else:
            overflow = total - self.capacity
            self.origin_logical += overflow
            self.origin_physical = (self.origin_physical + overflow) % self.capacity
            self.len = self.capacity
        source_first = max(0, self.origin_logical - start_position)
        return source_first, count - source_first

    # May a chunk's rows be written past `end` before `advance` commits them?  Only where no
    # slot past `end` holds a live row: a growing plane's (a ring's next slots hold its oldest
    # live rows).  A captured chunk pass asks (backends/cuda/chunk_graph.py).
    writes_ahead = False

    def make_room(self, start_position: int, count: int) -> None:
        """The checks `advance` makes for positions [start, start + count), and storage for
        them (a growing plane grows); bookkeeping unchanged.  Rows a `writes_ahead` plane then
        takes past `end` are not live until `advance`: a chunk abandoned in between leaves the
        plane as it was."""
        self._check_reservation(start_position, count)
        self._ensure_storage(start_position + count)

    def append(self, position: int) -> int:
        """Reserve one row for `position`; returns the slot it must be written to."""
        self.append_batch(position, 1)
        return self.slot(position)

    def advance(self, count: int, incoming: tuple[torch.Tensor, torch.Tensor] | None = None,
                evicted: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[int, int]:
        """Reserve the next `count` positions [end, end + count): metadata only, no row is written.

        An open checkpoint first logs the live rows the reservation evicts; `incoming`, the
        (keys, values) [count, KV, D] about to be written, lets it also log the rows of the chunk
        that a later row of the same chunk evicts (only a chunk wider than the ring has any);
        `evicted`: the live rows it evicts, copied out already (many.read_evictions).
        Returns (first_slot, first_row): rows [first_row, count) of the chunk stay live, row
        `first_row` goes to `first_slot` and the rest follow it (mod capacity).  Worked example,
        ring of capacity 4 holding 4 5 6 7 at slots [0, 4), origin_physical 0:
            advance(1)  -> (0, 0): position 8 goes to slot 0, origin 5 at slot 1, len 4
            advance(6) at 9 -> (3, 2): rows 11..14 live, row 2 (position 11) to slot 3
        """
        start = self.origin_logical + self.len
        self._check_reservation(start, count)
        if self.undo is not None:
            self.undo.before_advance(self, start, count, incoming, evicted)
        slot = (self.origin_physical + self.len) % self.capacity           # slot of `start`
        first_row, _ = self._reserve(start, count)
        return (slot + first_row) % self.capacity, first_row

    @staticmethod
    def follow(planes: list["Plane"], before: tuple[int, int, int],
               after: tuple[int, int, int]) -> None:
        """Give `planes` the bookkeeping `after` of a leader that moved from `before` in lockstep
        with them (many.advance_lockstep): metadata only, and only planes that were at that same
        `before`.  One call for a whole group: it runs for every plane and session of a batched
        step, so it is a compare and three stores a plane (growing planes grow with the leader)."""
        b_len, b_ol, b_op = before
        ln, ol, op = after
        end = ol + ln
        grows = bool(planes) and planes[0].kind == "growing"
        for p in planes:
            if p.len != b_len or p.origin_logical != b_ol or p.origin_physical != b_op:
                raise CacheError(f"layer {p.layer}: a lockstep plane at {p.bookmark()} cannot "
                                 f"follow one that moved from {before}")
            if grows:
                p._ensure_storage(end)
            p.len = ln
            p.origin_logical = ol
            p.origin_physical = op

    def bookmark(self) -> tuple[int, int, int]:
        """(len, origin_logical, origin_physical): the bookkeeping `rewind` puts back."""
        return self.len, self.origin_logical, self.origin_physical

    def rewind(self, mark: tuple[int, int, int]) -> None:
        """Put the bookkeeping back to `mark`, a `bookmark()` of this plane taken earlier: metadata
        only.  Rows written since stay in storage, outside the live range or overwritten later;
        a caller that let a step overwrite live rows restores them itself (checkpoint.py)."""
        ln, ol, op = mark
        if not (0 <= ln <= self.capacity and 0 <= ol and 0 <= op < self.capacity
                and ol + ln <= self.end):
            raise CacheError(f"layer {self.layer}: cannot rewind to len {ln}, origin {ol} at slot {op} "
                             f"from {self.metadata()}")
        self.len, self.origin_logical, self.origin_physical = ln, ol, op

    def open_undo(self, log) -> None:
        """Attach an open checkpoint's log (`checkpoint.PlaneUndo`): `advance` feeds it from now on."""
        if self.undo is not None:
            raise CheckpointError(f"layer {self.layer}: a checkpoint is already open")
        self.undo = log

    def close_undo(self) -> None:
        self.undo = None

    # ------------------------------------------------------------------ rows
    def _check_rows(self, keys: torch.Tensor, values: torch.Tensor, what: str) -> int:
        want = (self.kv_heads, self.head_dim)
        for name, t in (("keys", keys), ("values", values)):
            if t.dim() != 3 or tuple(t.shape[1:]) != want:
                raise CacheError(f"layer {self.layer}: {what} {name} must be [n, {want[0]}, {want[1]}], "
                                 f"got {list(t.shape)}")
        if keys.shape[0] != values.shape[0]:
            raise CacheError(f"layer {self.layer}: {what} has {keys.shape[0]} key rows "
                             f"but {values.shape[0]} value rows")
        return keys.shape[0]

    def store(self, start_position: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Reserve and write rows for positions [start, start + n).  keys/values [n, KV, D].

        Every check runs before anything changes: a refused store leaves the
        plane (and an open checkpoint's log) untouched.
        """
        n = self._check_rows(keys, values, "store")
        self._check_reservation(start_position, n)
        first_slot, first_row = self.advance(n, (keys, values))
        self.write_slots(first_slot, keys[first_row:], values[first_row:])

    def logical_rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Live rows in ascending position order: ([len, KV, D], [len, KV, D]) (a copy)."""
        return self.read_slots(self.origin_physical, self.len)

    def shadow_rows(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Live rows in position order, then `keys`/`values` [t, KV, D]: staging's detached
        shadow, each a new [len + t, KV, D] tensor in the plane's dtype."""
        old_k, old_v = self.logical_rows()
        return (torch.cat([old_k, keys.to(self.dtype)], dim=0),
                torch.cat([old_v, values.to(self.dtype)], dim=0))

    def install(self, start_position: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Lay logical rows for [start, start + n) into an empty-or-reset plane.

        The rotation is rebuilt, never read from the cut:
            rotation = start % capacity
        which is where sequential appends would have left origin_physical.
        Token-major: rows [0, capacity - rotation) go to slots [rotation, capacity)
        and the rest to [0, ...); head-major does the same per head.
        """
        n = self._check_rows(keys, values, "install")
        if n > self.capacity or start_position < 0 or start_position + n > self.max_context:
            raise CacheError(f"layer {self.layer}: cannot install {n} rows at {start_position} "
                             f"(capacity {self.capacity}, max_context {self.max_context})")
        if self.undo is not None:
            raise CacheError(f"layer {self.layer}: install while a checkpoint is open")
        self._ensure_storage(start_position + n)
        rotation = start_position % self.capacity
        self.origin_logical, self.origin_physical, self.len = start_position, rotation, n
        self.write_slots(rotation, keys, values)

    def reset(self) -> None:
        self.len = self.origin_logical = self.origin_physical = 0
        self.undo = None

    def check_invariants(self) -> None:
        ok = (0 <= self.len <= self.capacity and self.origin_logical >= 0
              and 0 <= self.origin_physical < self.capacity
              and self.end <= self.max_context)
        if not ok:
            raise CacheError(f"layer {self.layer}: invariant broken: {self.metadata()}")

    def metadata(self) -> dict:
        return dict(layer=self.layer, kind=self.kind, capacity=self.capacity, len=self.len,
                    origin_logical=self.origin_logical, origin_physical=self.origin_physical,
                    head_major=self.head_major)

    def row_bytes(self) -> int:
        """Bytes of one row of K plus one row of V."""
        return 2 * self.kv_heads * self.head_dim * self.dtype.itemsize

    # ------------------------------------------------------------------ layout hooks
    def read_slots(self, first_slot: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def slot_views(self, first_slot: int, count: int) -> list[tuple[torch.Tensor, torch.Tensor, int, int]]:
        """Where `count` rows from `first_slot` (mod capacity) live: [(keys view, values view,
        row offset, rows)], each view [rows, KV, D] -- what a writer copies rows `offset ..
        offset + rows` of its chunk into (one run, or two where a ring wraps)."""
        raise NotImplementedError

    def write_slots(self, first_slot: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        for kd, vd, off, n in self.slot_views(first_slot, keys.shape[0]):
            kd.copy_(keys[off:off + n])
            vd.copy_(values[off:off + n])

    def _ensure_storage(self, end_position: int) -> None:
        """Make sure slots for positions up to end_position exist (growing planes grow)."""
