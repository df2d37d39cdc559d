"""muser.cache: KV storage and its arithmetic.  Imports no model and no server.

Owns: building one plane per plane-owning layer from the layer map
(`build_planes`, `plane_index`), and re-exports the pieces: planes, staging,
checkpoints, snapshots, cost curves.  The sliding/full difference is decided
here exactly once, by `PLANES`.

KV-shared layers (Gemma 4: `LayerSpec.kv_source`) own no plane: they read their
source layer's.  A session's planes are therefore one per *owning* layer, each
named by its layer index, and everything that walks planes (cuts, packs,
checkpoints, cost curves) counts a shared plane once by construction.
"""
from __future__ import annotations

import torch

from ..config import LayerSpec
from .checkpoint import Checkpoint, PlaneUndo
from .growing import GrowingPlane
from .plan import CacheGeometry, CachePlan, plan
from .plane import Plane
from .ring import RingPlane
from .snapshot import Encoding, PlaneCut, SessionSnapshot
from .staging import Staged, stage


def _ring(layer: LayerSpec, max_context, kv_heads, head_dim, dtype, device) -> Plane:
    return RingPlane(layer.index, layer.window, max_context, layer.kv_heads or kv_heads,
                     layer.head_dim or head_dim, dtype, device)


def _growing(layer: LayerSpec, max_context, kv_heads, head_dim, dtype, device) -> Plane:
    return GrowingPlane(layer.index, max_context, layer.kv_heads or kv_heads, layer.head_dim or head_dim,
                        dtype, device, window=layer.window)


# backend family -> layer kind -> plane factory.  The oracle keeps full
# history everywhere and applies a sliding layer's window only as a mask.
PLANES = {
    "ring": {"sliding": _ring, "full": _growing},
    "oracle": {"sliding": _growing, "full": _growing},
}


def build_planes(layers: tuple[LayerSpec, ...], family: str, max_context: int, kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device) -> list[Plane]:
    """One plane per layer that owns one (in layer order); a layer's own kv_heads / head_dim
    win over the model-wide defaults passed here."""
    table = PLANES[family]
    return [table[layer.kind](layer, max_context, kv_heads, head_dim, dtype, device)
            for layer in layers if layer.kv_source is None]


def plane_index(layers: tuple[LayerSpec, ...]) -> list[int]:
    """For each layer, the index into `build_planes`' list of the plane it attends over:
    its own, or its kv_source's."""
    own: dict[int, int] = {}
    for layer in layers:
        if layer.kv_source is None:
            own[layer.index] = len(own)
    return [own[layer.index if layer.kv_source is None else layer.kv_source] for layer in layers]


def last_readers(layers: tuple[LayerSpec, ...]) -> dict[int, int]:
    """Source layer -> the last layer that reads its plane, for planes that KV-shared layers
    read.  A forward keeps such a layer's staged chunk uncommitted until that reader has
    attended (attend before overwrite, across layers)."""
    out: dict[int, int] = {}
    for layer in layers:
        if layer.kv_source is not None:
            out[layer.kv_source] = max(out.get(layer.kv_source, -1), layer.index)
    return out


__all__ = ["Plane", "RingPlane", "GrowingPlane", "Staged", "stage", "Checkpoint", "PlaneUndo",
           "Encoding", "PlaneCut", "SessionSnapshot", "CacheGeometry", "CachePlan", "plan",
           "build_planes", "plane_index", "last_readers", "PLANES"]
