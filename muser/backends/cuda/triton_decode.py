"""Decode attention on CUDA (Triton): planes read in place, by position, split across blocks.

Owns: `fused_decode_attention(qkv, ...)` -- one launch per layer that takes the
qkv projection of one token per batch row, applies qk-norm and RoPE, stores the
new K/V row into the row's plane (addressed through a *plane table*) and
attends over that plane; `decode_attention(q, ...)`, the same attention for an
already-prepared q (no store); `prepare_rows(qkv, ...)`, the same launch's
first half for the rows of a chunk (q, k, v out, no attention: the chunk path
attends with triton_chunk.py); and `plane_row(plane)`.  Does not own: the
plane bookkeeping (muser.cache; the graph runner fills `meta`), the reduction
shape and its pieces (triton_attn.py), the kernel's source (triton_decode_kernel.py).

Plane table (int64 [B, 4]) per layer and batch row:
    k_ptr, v_ptr          data pointers of the plane's K and V storage
    row_stride, head_stride   in elements (ring: token-major; growing: head-major)
Meta ([B, 2]):  slot the new row goes to, n = visible rows after the store.
Positions ([B]): the new row's position p.  The row sees positions [p - n + 1, p]; position
x lives at slot (slot + x - p), modulo the capacity on a ring -- so a ring is read in place,
rotation and all, in POSITION order.

Grid (B * KV, NSPLIT): program s takes split a0 + s of triton_attn's absolute splits (a0 =
the row's first), writes its (max, sum, acc) partial, and takes a ticket for its merge group.
The last of a group to arrive folds the group's partials in split order; when a row spans
several groups, the last group to arrive folds the groups in order.  Which program merges
never changes what is folded or in which order, so the result is bitwise reproducible --
and equal to a chunk row's (triton_chunk.py), which folds the same splits in the same order.
Counters only elect (stores, barrier, one gpu-scope acq_rel atomic: CUTLASS's split-K
semaphore pattern) and are back at 0 at the end.  All query heads of a KV group share one
pass over the keys (tl.dot, G padded to 16).  The fused form computes q and the new row in
every split (a few hundred elements), stores both (every split the same bits), and reads them
back like any other row: its attention is then the q-given form's, and a chunk's.
"""
from __future__ import annotations

import functools

import torch

from .l2_prefetch import launch_args
from .triton_attn import decode_keys, layout
from .triton_pieces import _pow2, pdl_launch, upload
from .triton_decode_kernel import _kernel

TAB_COLS = 4


def plane_row(plane) -> list[int]:
    """[k_ptr, v_ptr, row_stride, head_stride] of a plane's storage (elements)."""
    k, v = plane.keys, plane.values
    row_dim, head_dim = (1, 0) if plane.head_major else (0, 1)
    if k.stride() != v.stride():
        raise ValueError(f"layer {plane.layer}: K and V storage strides differ")
    row = [k.data_ptr(), v.data_ptr(), k.stride(row_dim), k.stride(head_dim)]
    # the kernels read a row at D % 8 == 0 as aligned (triton_attn.plane_at): refuse one that is not
    if k.shape[-1] % 8 == 0 and (row[0] % 16 or row[1] % 16 or row[2] % 8 or row[3] % 8):
        raise ValueError(f"layer {plane.layer}: K/V storage must be 16-byte aligned with strides "
                         f"in multiples of 8 elements; found pointers {row[0]:#x}, {row[1]:#x} "
                         f"and strides {row[2]}, {row[3]}")
    return row


def splits_for(capacity: int, growing: bool, split: int) -> int:
    """Grid width for a plane: enough programs for the most splits a row can span (static, so
    one graph serves every length).  A ring row spans `capacity` positions from anywhere:
    one split more than capacity / split when it starts mid-split."""
    return -(-capacity // split) + (0 if growing else 1)


class DecodeWorkspace:
    """Split partials and election counters for one (batch size, geometry); reused by every
    layer of a step (launches on one stream run one after another; counters end at 0)."""

    def __init__(self, batch: int, kv_heads: int, group: int, head_dim: int, nsplit: int, device,
                 ngroups: int | None = None):
        f32 = dict(dtype=torch.float32, device=device)
        self.nsplit = nsplit
        self.ngroups = ngroups if ngroups is not None else nsplit
        self.ms = torch.empty(batch * kv_heads * nsplit * group, **f32)
        self.ls = torch.empty_like(self.ms)
        self.acc = torch.empty(batch * kv_heads * nsplit * group * head_dim, **f32)
        # per (row, kv head): one top counter, then one per merge group the grid can touch
        self.cnt = torch.zeros(batch * kv_heads * (1 + self.ngroups), dtype=torch.int32, device=device)
        self.q = None                 # [B, H, D] the fused form's q (allocated on first use)

    def q_for(self, batch: int, heads: int, head_dim: int, dtype) -> torch.Tensor:
        """The fused form's q scratch: one buffer for every layer (the first call sizes it;
        a graph's warm-up makes that call before capture)."""
        n = batch * heads * head_dim
        if self.q is None or self.q.numel() < n or self.q.dtype != dtype:
            self.q = torch.empty(n, dtype=dtype, device=self.cnt.device)
        return self.q


def merge_groups(nsplit: int, group: int) -> int:
    """Merge groups a grid of `nsplit` splits can touch (its first split need not start one)."""
    return min(nsplit, -(-nsplit // group) + 1)


def _launch(qkv, q, pos, cos, sin, q_norm, k_norm, eps, table, meta, heads, kv_heads, head_dim,
            nsplit, scale, softcap, interleaved, ws, out, split, group, block_n, warps,
            depth=1, acc_dot=False, prep="decode", capacity=0, sinks=None, v_norm=False,
            k_eq_v=False, qout=None, grid_splits=None, pdl=False, maxnreg=None, prefetch=None,
            early=False):
    kern = _kernel()           # (the layout's chunk-only fields are left out: decode_keys)
    prepare = qout is not None and grid_splits == 1   # prepare_rows (prep "alone": PREP binary)
    B = table.shape[0]
    G = heads // kv_heads
    ngg = merge_groups(nsplit, group)
    if prepare:                                    # prepare_rows: nothing attends or merges
        ws = _prepare_workspace(table.device, ngg)
    elif (ws is None or ws.nsplit < nsplit or ws.ngroups < ngg
            or ws.cnt.numel() < B * kv_heads * (1 + ws.ngroups) or ws.ms.numel() < B * kv_heads * nsplit * G):
        ws = DecodeWorkspace(B, kv_heads, G, head_dim, nsplit, table.device, ngg)
    half = head_dim // 2
    block_h = _pow2(half, 8)
    src = qkv if qkv is not None else q
    rope = cos is not None
    dummy = ws.ms
    # a Prefetch (l2_prefetch.py) adds one grid row of prefetch.programs programs
    pf_args, pf_consts = launch_args(prefetch)
    grid = ((B * kv_heads, grid_splits or nsplit) if prefetch is None else
            (B * kv_heads + 1, max(grid_splits or nsplit, prefetch.programs)))
    kern[grid](
        src, src, pos, cos if rope else dummy, sin if rope else dummy,
        q_norm if q_norm is not None else dummy, k_norm if k_norm is not None else dummy,
        table, meta, ws.ms, ws.ls, ws.acc, ws.cnt, out, sinks if sinks is not None else dummy,
        qout if qout is not None else ws.q_for(B, heads, head_dim, src.dtype),
        float(scale), float(softcap or 1.0), float(eps), int(capacity), ws.ngroups, B * kv_heads,
        *pf_args,
        H=heads, KV=kv_heads, G=G, D=head_dim, HALF=half, BLOCK_H=block_h,
        BLOCK_G=_pow2(G, 16), BLOCK_GC=_pow2(G), BLOCK_N=block_n, NSPLIT=nsplit, SPLIT=split,
        GS=group, DEPTH=depth, FUSED=qkv is not None,
        QK_NORM=q_norm is not None, ROPE=rope, INTERLEAVED=bool(interleaved),
        SOFTCAP=softcap is not None, SINKS=sinks is not None, V_NORM=bool(v_norm),
        K_EQ_V=bool(k_eq_v), RING=capacity > 0, ACC_DOT=bool(acc_dot),
        PREP=prepare and prep == "alone",
        **pf_consts, EARLY=bool(early),
        num_warps=warps, enable_fp_fusion=False,
        # a register cap is register allocation only (the same instructions, the same bits):
        # 168 lets three programs share an SM where 208 let two (decode_step.regs_for)
        **({"maxnreg": int(maxnreg)} if maxnreg else {}), **pdl_launch(pdl))
    return out


def fused_decode_attention(qkv: torch.Tensor, pos: torch.Tensor, cos: torch.Tensor | None,
                           sin: torch.Tensor | None, q_norm: torch.Tensor | None,
                           k_norm: torch.Tensor | None, eps: float, table: torch.Tensor,
                           meta: torch.Tensor, heads: int, kv_heads: int, head_dim: int,
                           nsplit: int, scale: float, softcap: float | None, interleaved: bool,
                           ws: DecodeWorkspace | None = None, out: torch.Tensor | None = None,
                           sinks: torch.Tensor | None = None, v_norm: bool = False,
                           k_eq_v: bool = False, capacity: int = 0, pdl: bool = False,
                           prefetch=None, early: bool = False, **lay) -> torch.Tensor:
    """qkv [B, (H + 2KV) * D] -> attention output [B, H, D], one launch.

    Per batch row: qk-norm (if given) and RoPE (if cos/sin) of q and k in float32, each
    rounded to the activation dtype as muser.model.transformer rounds; the k/v row stored at
    meta's slot of the row's plane; attention over the row's n visible positions.  pos int64
    [B].  `capacity`: the ring's (0: a growing plane).  `lay`: triton_attn.layout's split /
    group / block_n / warps (defaults: a growing plane's).
    `sinks` float32 [H] (gpt-oss): each head's sink logit joins its softmax denominator.
    Gemma 4: `v_norm` (the new v row RMS-normed, no weight) and `k_eq_v` (qkv holds q | k only,
    and V is the raw K projection, before k-norm and RoPE).
    `prefetch`: an l2_prefetch.Prefetch -- byte ranges (the layer's next weights) the launch's
    extra grid row brings into the L2 (no value changes).
    `early` (MUSER_ATTN_EARLY; meant with `pdl`): the launch reads its plane table, slot,
    length, position, rotation and norm weights before the PDL wait, and its idle splits leave
    without waiting -- none of them is written by the launch before (no value changes).
    Graph-capturable: no host reads, static grid.
    """
    B = qkv.shape[0]
    if out is None:
        out = qkv.new_empty(B, heads, head_dim)
    lay = {**layout(capacity == 0, head_dim), **lay}
    return _launch(qkv, None, pos, cos, sin, q_norm, k_norm, eps, table, meta, heads, kv_heads,
                   head_dim, nsplit, scale, softcap, interleaved, ws, out, capacity=capacity,
                   sinks=sinks, v_norm=v_norm, k_eq_v=k_eq_v, pdl=pdl, prefetch=prefetch,
                   early=early, **decode_keys(lay))


def prepare_rows(qkv: torch.Tensor, pos: torch.Tensor, cos, sin, q_norm, k_norm, eps: float,
                 heads: int, kv_heads: int, head_dim: int, nsplit: int, interleaved: bool,
                 v_norm: bool = False, k_eq_v: bool = False, capacity: int = 0,
                 **lay) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A chunk's rows through the decode launch's first half: (q [R, H, D], k [R, KV, D],
    v [R, KV, D]) with qk-norm, RoPE and v-norm applied exactly as `fused_decode_attention`
    applies them -- it IS that launch (same kernel, same constants), told to write q out, to
    store each row's k/v into a buffer (its "plane"), and to attend over nothing."""
    R = qkv.shape[0]
    k = qkv.new_empty(R, kv_heads, head_dim)
    v = torch.empty_like(k)
    q = qkv.new_empty(R, heads, head_dim)
    table, meta = prepare_tables(k, v)
    prepare_rows_into(qkv, pos, cos, sin, q_norm, k_norm, eps, heads, kv_heads, head_dim, nsplit,
                      interleaved, q, k, v, table, meta, v_norm=v_norm, k_eq_v=k_eq_v,
                      capacity=capacity, **lay)
    return q, k, v


def prepare_tables(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The (table, meta) a prepare-only launch takes for buffers k / v [R, KV, D] (contiguous):
    every row's plane is the buffer, row r stores at slot r and attends over nothing.  The one
    row goes up without a wait (once a layer: a plain upload kept the host from running ahead of
    the GPU for a whole chunk pass) and is repeated R times on the device: built on the host,
    a 16k-row pass copied and pinned 512 KB a layer (~1 ms of host time a layer, more when the
    CPU is busy -- the fourteenth session's 16k prefill under a CPU load).  The meta is cached
    per row count (read-only, shared)."""
    R, KV, D = k.shape
    row = torch.tensor([[k.data_ptr(), v.data_ptr(), KV * D, D]], dtype=torch.int64)
    return upload(row, k.device).expand(R, 4).contiguous(), _prepare_meta(R, k.device)


@functools.lru_cache(maxsize=64)
def _prepare_meta(rows: int, device) -> torch.Tensor:
    r = torch.arange(rows, device=device)
    return torch.stack([r, torch.zeros_like(r)], 1).contiguous()


@functools.lru_cache(maxsize=8)
def _prepare_workspace(device, ngroups: int) -> "DecodeWorkspace":
    """The workspace a prepare-only launch passes and never touches (no split is live)."""
    return DecodeWorkspace(1, 1, 1, 1, 1, device, ngroups)


def prepare_rows_into(qkv, pos, cos, sin, q_norm, k_norm, eps: float, heads: int, kv_heads: int,
                      head_dim: int, nsplit: int, interleaved: bool, q: torch.Tensor,
                      k: torch.Tensor, v: torch.Tensor, table: torch.Tensor, meta: torch.Tensor,
                      v_norm: bool = False, k_eq_v: bool = False, capacity: int = 0,
                      **lay) -> None:
    """`prepare_rows` into given buffers (graph-capturable: no allocation, no host copy).
    table int64 [R, 4]: every row (k.data_ptr(), v.data_ptr(), KV * D, D); meta int64 [R, 2]:
    row r (r, 0) -- row r stores at slot r and attends over nothing."""
    lay = {**layout(capacity == 0, head_dim), **lay}
    _launch(qkv, None, pos, cos, sin, q_norm, k_norm, eps, table, meta, heads, kv_heads,
            head_dim, nsplit, 1.0, None, interleaved, None, q, capacity=capacity,
            v_norm=v_norm, k_eq_v=k_eq_v, qout=q, grid_splits=1, **decode_keys(lay))


def decode_attention(q: torch.Tensor, pos: torch.Tensor, table: torch.Tensor, meta: torch.Tensor,
                     kv_heads: int, nsplit: int, scale: float, softcap: float | None,
                     ws: DecodeWorkspace | None = None, out: torch.Tensor | None = None,
                     sinks: torch.Tensor | None = None, capacity: int = 0, **lay) -> torch.Tensor:
    """q [B, H, D] (cache dtype, already normed/rotated) at positions pos [B] over each row's
    plane -> [B, H, D].  table int64 [B, 4], meta [B, 2] (see module doc); `nsplit` from
    `splits_for`.  Graph-capturable: no host reads, static grid."""
    B, H, D = q.shape
    if out is None:
        out = torch.empty_like(q)
    lay = {**layout(capacity == 0, D), **lay}
    return _launch(None, q, pos, None, None, None, None, 0.0, table, meta, H, kv_heads, D,
                   nsplit, scale, softcap, False, ws, out, capacity=capacity, sinks=sinks,
                   **decode_keys(lay))
