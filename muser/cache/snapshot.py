"""The session cut contract: `SessionSnapshot`, its encodings and the shape gate.

Owns: what a complete restorable cut at `position` is, how one leaves a set
of planes (`take`) and how it is checked and laid back (`check`, `install`).
Does not own: bytes on disk (muser.pack: `save_pack`, `load_pack`,
`pack_to_bytes`, `pack_from_bytes`) or which model made it (the engine
fills `model`, an opaque fingerprint dict, and `tokens`, the lineage).

The contract, per plane:
  ring     exactly min(position, capacity) rows for [position - count, position)
  growing  exactly `position` rows for [0, position)
Rows are in logical order (ascending position, no rotation): rotation is a
function of the logical origin, so it is thrown away here and rebuilt by
`Plane.install`.  That is what makes a restored ring replay bitwise: attention
reads rows in physical order and float sums are order-sensitive.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..errors import EncodingMismatch, SnapshotShapeError
from .plane import Plane


@dataclass(frozen=True)
class Encoding:
    """Which backend family and dtype defined a cut.  Cuts of different encodings refuse each other."""

    family: str      # "ring" (production) | "oracle" (f32 full-history reference)
    dtype: str       # "float32" | "bfloat16" | "float16"

    def __str__(self) -> str:
        return f"{self.family}/{self.dtype}"


@dataclass(frozen=True)
class PlaneCut:
    layer: int
    kind: str                  # "ring" | "growing"
    window: int | None         # the attention window the plane applied
    start: int                 # position of row 0
    count: int
    keys: torch.Tensor         # [count, KV, D] logical order
    values: torch.Tensor       # [count, KV, D]

    @property
    def nbytes(self) -> int:
        return 2 * self.keys.numel() * self.keys.element_size()


@dataclass(frozen=True)
class SessionSnapshot:
    position: int
    encoding: Encoding
    planes: tuple[PlaneCut, ...]
    tokens: tuple[int, ...] = ()           # ids consumed, the lineage (may be empty)
    model: dict = field(default_factory=dict)   # fingerprint, filled by the engine

    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.planes)

    def equal(self, other: "SessionSnapshot") -> bool:
        """Bitwise equality of position, encoding and every row."""
        return (self.position == other.position and self.encoding == other.encoding
                and len(self.planes) == len(other.planes)
                and all(a.layer == b.layer and a.kind == b.kind and a.start == b.start
                        and a.count == b.count and torch.equal(a.keys, b.keys)
                        and torch.equal(a.values, b.values)
                        for a, b in zip(self.planes, other.planes)))


def expected_rows(plane: Plane, position: int) -> tuple[int, int]:
    """(start, count) the cut contract demands of `plane` at `position`."""
    count = min(position, plane.capacity) if plane.kind == "ring" else position
    return position - count, count


def take(planes: list[Plane], position: int, encoding: Encoding,
         tokens: tuple[int, ...] = (), model: dict | None = None) -> SessionSnapshot:
    cuts = []
    for p in planes:
        if p.end != position:
            raise SnapshotShapeError(p.layer, "end position", position, p.end)
        k, v = p.logical_rows()
        cuts.append(PlaneCut(p.layer, p.kind, p.window, p.origin_logical, p.len, k, v))
    return SessionSnapshot(position, encoding, tuple(cuts), tuple(tokens), dict(model or {}))


def check(snap: SessionSnapshot, planes: list[Plane], encoding: Encoding) -> None:
    """The shape gate: every field of every plane, before anything is installed."""
    if snap.encoding != encoding:
        raise EncodingMismatch(str(encoding), str(snap.encoding))
    if len(snap.planes) != len(planes):
        raise SnapshotShapeError(-1, "plane count", len(planes), len(snap.planes))
    if snap.position < 0 or snap.position > min((p.max_context for p in planes), default=0):
        raise SnapshotShapeError(-1, "position", f"0..{min(p.max_context for p in planes)}", snap.position)
    for cut, p in zip(snap.planes, planes):
        start, count = expected_rows(p, snap.position)
        shape = (count, p.kv_heads, p.head_dim)
        for name, want, got in (
            ("layer", p.layer, cut.layer), ("kind", p.kind, cut.kind),
            ("window", p.window, cut.window), ("start", start, cut.start),
            ("count", count, cut.count),
            ("keys shape", shape, tuple(cut.keys.shape)),
            ("values shape", shape, tuple(cut.values.shape)),
            ("keys dtype", p.dtype, cut.keys.dtype), ("values dtype", p.dtype, cut.values.dtype),
            ("keys bytes", count * p.row_bytes() // 2, cut.keys.numel() * cut.keys.element_size()),
            ("values bytes", count * p.row_bytes() // 2, cut.values.numel() * cut.values.element_size()),
        ):
            if want != got:
                raise SnapshotShapeError(p.layer, name, want, got)


def install(snap: SessionSnapshot, planes: list[Plane], encoding: Encoding) -> None:
    """Gate everything first, then lay every plane back with its rotation rebuilt."""
    check(snap, planes, encoding)
    for p in planes:
        p.reset()
    for cut, p in zip(snap.planes, planes):
        p.install(cut.start, cut.keys.to(p.device), cut.values.to(p.device))
