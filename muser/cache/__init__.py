"""muser.cache: KV storage and its arithmetic.  Imports no model and no server.

Owns: building one plane per layer from the layer map (`build_planes`), and
re-exports the pieces: planes, staging, checkpoints, snapshots, cost curves.
The sliding/full difference is decided here exactly once, by `PLANES`.
"""
from __future__ import annotations

import torch

from ..config import LayerSpec
from .checkpoint import Checkpoint, PlaneUndo
from .plan import CacheGeometry, CachePlan, plan
from .plane import GrowingPlane, Plane, RingPlane
from .snapshot import Encoding, PlaneCut, SessionSnapshot
from .staging import Staged, stage


def _ring(layer: LayerSpec, max_context, kv_heads, head_dim, dtype, device) -> Plane:
    return RingPlane(layer.index, layer.window, max_context, kv_heads, head_dim, dtype, device)


def _growing(layer: LayerSpec, max_context, kv_heads, head_dim, dtype, device) -> Plane:
    return GrowingPlane(layer.index, max_context, kv_heads, head_dim, dtype, device, window=layer.window)


# backend family -> layer kind -> plane factory.  The oracle keeps full
# history everywhere and applies a sliding layer's window only as a mask.
PLANES = {
    "ring": {"sliding": _ring, "full": _growing},
    "oracle": {"sliding": _growing, "full": _growing},
}


def build_planes(layers: tuple[LayerSpec, ...], family: str, max_context: int, kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device) -> list[Plane]:
    table = PLANES[family]
    return [table[layer.kind](layer, max_context, kv_heads, head_dim, dtype, device) for layer in layers]


__all__ = ["Plane", "RingPlane", "GrowingPlane", "Staged", "stage", "Checkpoint", "PlaneUndo",
           "Encoding", "PlaneCut", "SessionSnapshot", "CacheGeometry", "CachePlan", "plan",
           "build_planes", "PLANES"]
