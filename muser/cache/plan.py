"""Cost curves: bytes each plane kind holds at a context length.  Pure arithmetic, no torch.

Owns: `CacheGeometry` and `plan(geometry, context) -> CachePlan`.  Does not
own: allocation (the planes) or reading a model config (muser.model.spec;
the CLI builds a geometry from a ModelSpec).

    ring plane     min(context, capacity) rows, capacity = min(max_context, W)  -> flat after W
    growing plane  context rows                                             -> linear to max_context

Per-layer geometry (Gemma 4: 512-wide global heads) is `layer_rows`; a KV-shared
layer (`shared`) reads another layer's plane and holds nothing: it is counted once,
as its source, and reported apart with the bytes sharing saves.

The design chapter's geometry: 39 sliding layers (W = 2,048) + 13 full, rows
of 1,024 bytes (K+V, f16), max context 131,072:
    sliding = 39 x 2,048 x 1,024   =    81,788,928 bytes at any context >= 2,048
    full    = 13 x 131,072 x 1,024 = 1,744,830,464 bytes at 131,072
"""
from __future__ import annotations

from dataclasses import dataclass

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "f32": 4, "bf16": 2, "f16": 2}


@dataclass(frozen=True)
class CacheGeometry:
    windows: tuple[int | None, ...]   # one per layer: W for sliding, None for full
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    max_context: int
    layer_rows: tuple[tuple[int, int], ...] | None = None   # per layer (kv_heads, head_dim), when they vary
    shared: tuple[bool, ...] | None = None                  # per layer: reads another layer's plane

    @property
    def row_bytes(self) -> int:
        """K + V of one token in one layer (the model-wide geometry)."""
        return 2 * self.kv_heads * self.head_dim * self.dtype_bytes

    def layer_row_bytes(self, i: int) -> int:
        if self.layer_rows is None:
            return self.row_bytes
        kv, d = self.layer_rows[i]
        return 2 * kv * d * self.dtype_bytes


@dataclass(frozen=True)
class CachePlan:
    context: int
    sliding_layers: int
    full_layers: int
    sliding_bytes: int
    full_bytes: int
    shared_layers: int = 0      # layers that read another layer's plane (not in the counts above)
    shared_saved_bytes: int = 0  # what those layers would hold with planes of their own

    @property
    def total_bytes(self) -> int:
        return self.sliding_bytes + self.full_bytes


def plan(geometry: CacheGeometry, context: int) -> CachePlan:
    if not 0 <= context <= geometry.max_context:
        raise ValueError(f"context must be in [0, {geometry.max_context}], got {context}")
    sliding = full = saved = 0
    n_sliding = n_full = n_shared = 0
    for i, w in enumerate(geometry.windows):
        rows = context if w is None else min(context, geometry.max_context, w)
        nbytes = rows * geometry.layer_row_bytes(i)
        if geometry.shared is not None and geometry.shared[i]:
            n_shared += 1
            saved += nbytes
        elif w is None:
            n_full += 1
            full += nbytes
        else:
            n_sliding += 1
            sliding += nbytes
    return CachePlan(context, n_sliding, n_full, sliding, full, n_shared, saved)


def curve(geometry: CacheGeometry, points: int = 64) -> list[CachePlan]:
    """Plans at `points` contexts spread from 0 to max_context (for plotting)."""
    step = max(1, geometry.max_context // points)
    ctxs = list(range(0, geometry.max_context + 1, step))
    if ctxs[-1] != geometry.max_context:
        ctxs.append(geometry.max_context)
    return [plan(geometry, c) for c in ctxs]
