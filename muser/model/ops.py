"""The ops table of a layer's element-wise pieces, and their eager maths.

Owns: `Ops`, the table of element-wise pieces a device may run its own way
(norm, qk-norm + RoPE, act * up, residual add + norm, how long a RoPE table to
build, the experts), and `EAGER`, the plain-torch table -- the specification the
backends' tables are tested against; the eager pieces themselves (RMS / layer
norm, qk-norm + RoPE, the activation and act * up, the residual add with its
optional post-norm and next norm); and RoPE at a layer's positions: the cos/sin
tables (half-rotation and interleaved, over the layer's own head dim; schedules
from `rope.py`), cached per schedule, gathered once per forward pass per schedule
(`rope_for`), and the rotation itself (`apply_rope`).
Does not own: the wiring of a layer, the projections, the feed-forward, the
embedding or the head (`transformer.py`, which calls these pieces through an
`Ops`), the experts' maths (`moe.py`), or which device runs what (muser.backends
builds its own tables from these pieces: native CPU kernels, Triton row kernels
on CUDA).  Nothing here asks what device a tensor is on.

Dtypes: norms and RoPE run in float32 (the numerics need it), each casting back
to the activation dtype.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from muser.config import LayerSpec, ModelSpec, RopeScaling
from muser.model import moe, rope


# ----------------------------------------------------------------------------- RoPE
_ROPE: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def rope_tables(theta: float, scale: float, head_dim: int, device, length: int,
                scaling: RopeScaling | None = None):
    """(cos, sin), each float32 [L >= length, head_dim/2], cached per (theta, scale, scaling, head_dim, device).

    Computed the way transformers does (float32 inverse frequencies from `rope.inv_freq`,
    float32 position x frequency, cos/sin times the schedule's amplitude -- 1 except
    YaRN), so angles agree bitwise.
    """
    device = torch.device(device)
    key = (float(theta), float(scale), scaling, int(head_dim), device)
    hit = _ROPE.get(key)
    if hit is not None and hit[0].shape[0] >= length:
        return hit
    n = 1024
    while n < length:
        n *= 2
    inv, amp = rope.inv_freq(theta, scale, scaling, head_dim, device)
    freqs = torch.arange(n, dtype=torch.float32, device=device)[:, None] * inv[None, :]   # [n, D/2]
    cos, sin = freqs.cos(), freqs.sin()
    if amp != 1.0:
        cos, sin = cos * amp, sin * amp
    _ROPE[key] = (cos, sin)
    return _ROPE[key]


def rope_rows_asked(spec: ModelSpec, positions: torch.Tensor) -> int:
    """A RoPE table as long as the positions asked (reads one position back to the host)."""
    return int(positions.max()) + 1


def rope_rows_context(spec: ModelSpec, positions: torch.Tensor) -> int:
    """A RoPE table for the whole context: no step ever reads a position back (a device sync)."""
    return spec.max_context


def rope_for(spec: ModelSpec, ls: LayerSpec, positions: torch.Tensor, memo: dict | None = None,
             ops: "Ops | None" = None):
    """cos, sin float32 [T, D/2] for this layer's RoPE at `positions` [T].

    `memo`: a dict the caller keeps for one forward pass (one `positions`), so the
    layers sharing a RoPE schedule (all sliding layers, all full layers) gather once.
    The table's length (`ops.rope_rows`) never changes a value: row p is p x freq."""
    if memo is not None:
        key = (ls.rope_theta, ls.rope_scale, ls.rope_scaling, ls.head_dim)
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = rope_for(spec, ls, positions, None, ops)
        return hit
    need = (ops or EAGER).rope_rows(spec, positions)
    cos, sin = rope_tables(ls.rope_theta, ls.rope_scale, ls.head_dim, positions.device, need, ls.rope_scaling)
    return cos[positions], sin[positions]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """Rotate x [T, N, D] by cos/sin [T, D/2] in float32; returns x's dtype.

    half-rotation (Llama, Gemma): pairs (x[i], x[i + D/2]);
    interleaved (Cohere): pairs (x[2i], x[2i + 1]).
    """
    xf = x.float()
    c, s = cos[:, None, :], sin[:, None, :]                       # [T, 1, D/2]
    if interleaved:
        x0, x1 = xf[..., 0::2], xf[..., 1::2]
        out = torch.stack((x0 * c - x1 * s, x1 * c + x0 * s), dim=-1).flatten(-2)
    else:
        h = xf.shape[-1] // 2
        x0, x1 = xf[..., :h], xf[..., h:]
        out = torch.cat((x0 * c - x1 * s, x1 * c + x0 * s), dim=-1)
    return out.to(x.dtype)


# ----------------------------------------------------------------------------- pieces
def norm(x: torch.Tensor, w: torch.Tensor, spec: ModelSpec) -> torch.Tensor:
    """RMS norm or (bias-free) layer norm over the last dim, in float32; w is effective."""
    xf = x.float()
    if spec.norm == "rms":
        out = F.rms_norm(xf, (xf.shape[-1],), w, spec.norm_eps)
    else:
        out = F.layer_norm(xf, (xf.shape[-1],), w, None, spec.norm_eps)
    return out.to(x.dtype)


def norm_rope(x: torch.Tensor, w: torch.Tensor | None, spec: ModelSpec, cos, sin,
              norm_fn: Callable = norm) -> torch.Tensor:
    """qk-norm (when w is given, through `norm_fn`) then RoPE (when cos/sin are given) of x [T, N, D]."""
    if w is None and cos is None:
        return x
    if w is not None:
        x = norm_fn(x, w, spec)
    return x if cos is None else apply_rope(x, cos, sin, spec.rope_interleaved)


def _act(x: torch.Tensor, spec: ModelSpec) -> torch.Tensor:
    return F.gelu(x, approximate="tanh") if spec.activation == "gelu_tanh" else F.silu(x)


def act_mul(gate: torch.Tensor, up: torch.Tensor, spec: ModelSpec) -> torch.Tensor:
    return _act(gate, spec) * up


def residual(h: torch.Tensor, d: torch.Tensor, spec: ModelSpec, w_post: torch.Tensor | None = None,
             w_next: torch.Tensor | None = None, d2: torch.Tensor | None = None,
             norm_fn: Callable = norm):
    """h' = h + norm(d, w_post) (d as is without w_post) [+ d2]; returns (h', norm(h', w_next) or None)."""
    if w_post is not None:
        d = norm_fn(d, w_post, spec)
    h = h + d
    if d2 is not None:
        h = h + d2
    return h, (None if w_next is None else norm_fn(h, w_next, spec))


@dataclass(frozen=True)
class Ops:
    """The element-wise pieces of a layer a device may run its own way, same signatures as the
    eager functions above (`residual` without `norm_fn`).  A backend builds one per engine."""

    norm: Callable          # (x, w, spec) -> x's dtype
    norm_rope: Callable     # (x [T, N, D], w | None, spec, cos | None, sin | None)
    act_mul: Callable       # (gate, up, spec)
    residual: Callable      # (h, d, spec, w_post=None, w_next=None, d2=None) -> (h', x | None)
    rope_rows: Callable     # (spec, positions) -> rows of the RoPE table to build
    experts: Callable = moe.experts   # (mw, ms, x [T, hidden], weights [T, k], idx [T, k]) -> [T, hidden]


EAGER = Ops(norm=norm, norm_rope=norm_rope, act_mul=act_mul, residual=residual, rope_rows=rope_rows_asked)
