"""Fused element-wise pieces of one decode step on CUDA (Triton), one launch each.

Owns: `add_norm` (residual add(s), optional sandwich norm of the delta, the
next norm; rows of any count, so prefill chunks use it too, via
`triton_rows.py`), `embed_norm` (the embedding rows, their scale and the
first norm) and `qk_rope_store` (qk-norm + RoPE of q and k, and the store of
the new k/v row straight into each batch row's plane through a plane table).
Does not own: the pieces these kernels share with others (triton_pieces.py), the
projections (triton_dot.py), attention (triton_decode.py), act*up (triton_rows.act_mul) or
plane bookkeeping.

Every kernel rounds where `muser.model.transformer` rounds (norm and RoPE in
float32, cast back to the activation dtype after each), so the decode step
agrees with the chunk path up to the order of float32 sums.  Triton is
imported lazily: this module imports on a machine without it.
"""
from __future__ import annotations

import functools

import torch

from .triton_pieces import _pow2, norm_pieces, pdl_launch, pdl_pieces, rope_pieces


@functools.lru_cache(maxsize=None)
def _kernels():
    import triton
    import triton.language as tl

    globals()["tl"] = tl                # the interpreter looks for the language in module globals
    globals().update(pdl_pieces())      # module globals: the interpreter resolves names there
    globals().update(rope_pieces())
    globals().update(norm_pieces())

    @triton.jit
    def add_norm_kernel(H, D1, D2, W_POST, W_NEXT, H_OUT, X_OUT, eps,
                        N: tl.constexpr, BLOCK: tl.constexpr, HAS_D1: tl.constexpr,
                        HAS_D2: tl.constexpr, POST: tl.constexpr, LAYERNORM: tl.constexpr,
                        NEXT: tl.constexpr, PDL: tl.constexpr):
        _pdl_begin(PDL)                     # PDL: wait for the kernel before, first
        row = tl.program_id(0).to(tl.int64)        # chunks: rows x N can pass 2**31
        i = tl.arange(0, BLOCK)
        mask = i < N
        h, d1 = _norm_inputs(H, D1, H, row, i, mask, 1, N, HAS_D1, 0, False)
        _add_norm_tail(h, d1, row, i, mask, D2, W_POST, W_NEXT, H_OUT, X_OUT, eps, N,
                       HAS_D1, HAS_D2, POST, LAYERNORM, NEXT)

    @triton.jit
    def add_pieces_norm_kernel(H, P, S, W_POST, W_NEXT, H_OUT, X_OUT, eps, B,
                               N: tl.constexpr, BLOCK: tl.constexpr, PIECES: tl.constexpr,
                               WQ: tl.constexpr, POST: tl.constexpr, LAYERNORM: tl.constexpr,
                               NEXT: tl.constexpr, PDL: tl.constexpr):
        """add_norm whose d1 is a projection's split-K pieces P [PIECES, B, N] float32, summed
        first exactly as split_sum_kernel sums them (in order from zero, the int8 scale, rounded
        to the activation dtype) -- one launch instead of split_sum + add_norm."""
        _pdl_begin(PDL)                     # PDL: wait for the kernel before, first
        row = tl.program_id(0).to(tl.int64)
        i = tl.arange(0, BLOCK)
        mask = i < N
        h, d1 = _norm_inputs(H, P, S, row, i, mask, B, N, True, PIECES, WQ)
        _add_norm_tail(h, d1, row, i, mask, H, W_POST, W_NEXT, H_OUT, X_OUT, eps, N, True,
                       False, POST, LAYERNORM, NEXT)

    @triton.jit
    def qk_rope_store_kernel(QKV, POS, COS, SIN, QN, KN, TAB, META, Q_OUT, eps,
                             H: tl.constexpr, KV: tl.constexpr, D: tl.constexpr,
                             HALF: tl.constexpr, BLOCK: tl.constexpr, QK_NORM: tl.constexpr,
                             ROPE: tl.constexpr, INTERLEAVED: tl.constexpr):
        b = tl.program_id(0)
        j = tl.program_id(1)                       # q heads [0, H), then kv heads [H, H + KV)
        i = tl.arange(0, BLOCK)
        mask = i < HALF
        i0, i1 = _halves(i, HALF, INTERLEAVED)
        # Plane address and slot first: independent loads in flight together (latency-bound)
        kp = tl.load(TAB + b * 4).to(tl.pointer_type(QKV.dtype.element_ty))
        vp = tl.load(TAB + b * 4 + 1).to(tl.pointer_type(QKV.dtype.element_ty))
        rs = tl.load(TAB + b * 4 + 2)
        hs = tl.load(TAB + b * 4 + 3)
        slot = tl.load(META + b * 2).to(tl.int64)
        row = QKV + b * (H + 2 * KV) * D
        src = row + j * D
        x0 = tl.load(src + i0, mask=mask, other=0.0)
        x1 = tl.load(src + i1, mask=mask, other=0.0)
        dt = x0.dtype
        a0 = x0.to(tl.float32)
        a1 = x1.to(tl.float32)
        if QK_NORM:
            if j < H:
                w0 = tl.load(QN + i0, mask=mask, other=0.0)
                w1 = tl.load(QN + i1, mask=mask, other=0.0)
            else:
                w0 = tl.load(KN + i0, mask=mask, other=0.0)
                w1 = tl.load(KN + i1, mask=mask, other=0.0)
            r = tl.rsqrt((tl.sum(a0 * a0, 0) + tl.sum(a1 * a1, 0)) / D + eps)
            a0 = (a0 * r * w0).to(dt).to(tl.float32)
            a1 = (a1 * r * w1).to(dt).to(tl.float32)
        if ROPE:
            pos = tl.load(POS + b)
            c = tl.load(COS + pos * HALF + i, mask=mask, other=0.0)
            s = tl.load(SIN + pos * HALF + i, mask=mask, other=0.0)
            o0, o1 = _rotate(a0, a1, c, s)
        else:
            o0 = a0
            o1 = a1
        if j < H:
            dst = Q_OUT + (b * H + j) * D
            tl.store(dst + i0, o0.to(dt), mask=mask)
            tl.store(dst + i1, o1.to(dt), mask=mask)
        else:
            kvh = j - H
            off = slot * rs + kvh * hs
            tl.store(kp + off + i0, o0.to(dt), mask=mask)
            tl.store(kp + off + i1, o1.to(dt), mask=mask)
            vsrc = row + (H + KV + kvh) * D
            tl.store(vp + off + i0, tl.load(vsrc + i0, mask=mask, other=0.0), mask=mask)
            tl.store(vp + off + i1, tl.load(vsrc + i1, mask=mask, other=0.0), mask=mask)

    @triton.jit
    def embed_norm_kernel(IDS, E, ES, SCALE, W_NEXT, H_OUT, X_OUT, eps, N: tl.constexpr,
                          BLOCK: tl.constexpr, SCALED: tl.constexpr, LAYERNORM: tl.constexpr,
                          NEXT: tl.constexpr, PDL: tl.constexpr, Q8: tl.constexpr = False):
        """h = E[ids] (* SCALE, rounded once: transformer.embed) stored, then add_norm's x =
        norm(h) from the same tail -- the embedding, its scale and the first norm in one launch.
        Q8: E int8 and ES its float16 scale a 32-key block (weights_int8.BLOCK; EmbedBlocks):
        h = dtype(q * s), the product exact in float32, EmbedBlocks.rows' one rounding."""
        _pdl_begin(PDL)                     # PDL: the ids are the step's upload
        row = tl.program_id(0).to(tl.int64)
        i = tl.arange(0, BLOCK)
        mask = i < N
        tok = tl.load(IDS + row).to(tl.int64)
        if Q8:
            q = tl.load(E + tok * N + i, mask=mask, other=0).to(tl.float32)
            s = tl.load(ES + tok * (N // 32) + i // 32, mask=mask, other=0.0).to(tl.float32)
            h = (q * s).to(H_OUT.dtype.element_ty)
        else:
            h = tl.load(E + tok * N + i, mask=mask, other=0.0)
        if SCALED:          # bf16 x bf16 is exact in float32: one rounding, torch's
            h = (h.to(tl.float32) * tl.load(SCALE).to(tl.float32)).to(h.dtype)
        tl.store(H_OUT + row * N + i, h, mask=mask)
        _add_norm_tail(h, h, row, i, mask, H_OUT, W_NEXT, W_NEXT, H_OUT, X_OUT, eps, N, False,
                       False, False, LAYERNORM, NEXT)

    return add_norm_kernel, qk_rope_store_kernel, add_pieces_norm_kernel, embed_norm_kernel


def _row_shape(N: int) -> dict:
    """A norm row's block and warps, one rule for every launch that norms a row through
    `_add_norm_tail` (add_norm, its pieces form, embed_norm): the block and warps fix the
    reduction's tree, so launches that share it give the same bits for the same row."""
    return {"BLOCK": _pow2(N), "num_warps": 8 if N >= 2048 else 4}


def add_norm(h: torch.Tensor, w_next: torch.Tensor | None, eps: float, layernorm: bool,
             d1: torch.Tensor | None = None, d2: torch.Tensor | None = None,
             w_post: torch.Tensor | None = None, h_out: torch.Tensor | None = None,
             x_out: torch.Tensor | None = None, pdl: bool = False):
    """h' = h + norm?(d1) [+ d2]; x = norm(h', w_next).  Returns (h', x); contiguous rows [B, N],
    any B (the decode step's batch, or a prefill chunk's rows: `triton_rows`).

    With d1 None, h' is h and only the norm runs (the first layer's input norm); with w_next
    None, only h' is computed and x is None.  d1 may be a projection's unsummed split-K pieces
    (triton_dot.Pieces, no d2): summed first as split_sum_kernel sums them, in this launch.
    """
    B, N = h.shape
    grid = (B,)
    if isinstance(d1, tuple) and d2 is None:           # triton_dot.Pieces: sum them here
        part, scale = d1
        h_out = h_out if h_out is not None else torch.empty_like(h)
        if w_next is not None:
            x_out = x_out if x_out is not None else torch.empty_like(h)
        w_any = w_next if w_next is not None else (w_post if w_post is not None else h)
        _kernels()[2][grid](h, part, scale if scale is not None else part,
                            w_post if w_post is not None else w_any, w_any, h_out,
                            x_out if w_next is not None else h_out, float(eps), B,
                            N=N, PIECES=part.shape[0], WQ=scale is not None,
                            POST=w_post is not None, LAYERNORM=layernorm,
                            NEXT=w_next is not None, **_row_shape(N), **pdl_launch(pdl))
        return h_out, (x_out if w_next is not None else None)
    kern = _kernels()[0]
    h_out = h if d1 is None else (h_out if h_out is not None else torch.empty_like(h))
    if w_next is not None:
        x_out = x_out if x_out is not None else torch.empty_like(h)
    w_any = w_next if w_next is not None else (w_post if w_post is not None else h)
    kern[grid](h, d1 if d1 is not None else h, d2 if d2 is not None else h,
               w_post if w_post is not None else w_any, w_any, h_out,
               x_out if w_next is not None else h_out, float(eps),
               N=N, HAS_D1=d1 is not None, HAS_D2=d2 is not None,
               POST=w_post is not None, LAYERNORM=layernorm, NEXT=w_next is not None,
               **_row_shape(N), **pdl_launch(pdl))
    return h_out, (x_out if w_next is not None else None)


def embed_norm(ids: torch.Tensor, table, scale: torch.Tensor | None,
               w_next: torch.Tensor | None, eps: float, layernorm: bool, pdl: bool = False):
    """ids [B] (ints < table rows) -> (h, x): h = table[ids] (* scale, a 0-dim tensor of the
    table's dtype, as `transformer.embed` multiplies), x = norm(h, w_next) or None -- the
    bits of F.embedding (or of EmbedBlocks.rows: `table` a tied head's exact Q8_0 blocks),
    the multiply and add_norm(h, w_next), in one launch."""
    blocks = getattr(table, "blocks", None)             # weights_int8.EmbedBlocks
    if ids.dim() != 1 or ids.dtype not in (torch.int32, torch.int64) or len(table.shape) != 2:
        raise ValueError(f"embed_norm needs int ids [B] and a table [V, N], got {ids.dtype} "
                         f"{tuple(ids.shape)} and {tuple(table.shape)}")
    if scale is not None and (scale.dim() != 0 or scale.dtype != table.dtype):
        raise ValueError(f"the embedding scale must be a 0-dim {table.dtype} tensor, got "
                         f"{scale.dtype} {tuple(scale.shape)}")
    B, N = ids.shape[0], table.shape[1]
    ids = ids.contiguous()
    e, es = (blocks.q, blocks.scale) if blocks is not None else (table.contiguous(),) * 2
    h = torch.empty(B, N, dtype=table.dtype, device=ids.device)
    x = torch.empty_like(h) if w_next is not None else None
    if B:
        _kernels()[3][(B,)](ids, e, es, scale if scale is not None else h,
                            w_next if w_next is not None else h, h, x if x is not None else h,
                            float(eps), N=N, SCALED=scale is not None,
                            LAYERNORM=layernorm, NEXT=w_next is not None, Q8=blocks is not None,
                            **_row_shape(N), **pdl_launch(pdl))
    return h, x


def qk_rope_store(qkv: torch.Tensor, pos: torch.Tensor, cos: torch.Tensor | None,
                  sin: torch.Tensor | None, q_norm: torch.Tensor | None, k_norm: torch.Tensor | None,
                  eps: float, table: torch.Tensor, meta: torch.Tensor, heads: int, kv_heads: int,
                  head_dim: int, interleaved: bool, q_out: torch.Tensor | None = None) -> torch.Tensor:
    """Split qkv [B, (H + 2KV) * D]; qk-norm + RoPE; k/v rows stored at meta's slot of each
    batch row's plane (table, see triton_decode); returns q [B, H, D]."""
    kern = _kernels()[1]
    B = qkv.shape[0]
    q_out = q_out if q_out is not None else qkv.new_empty(B, heads, head_dim)
    half = head_dim // 2
    rope = cos is not None
    kern[(B, heads + kv_heads)](
        qkv, pos, cos if rope else qkv, sin if rope else qkv,
        q_norm if q_norm is not None else qkv, k_norm if k_norm is not None else qkv,
        table, meta, q_out, float(eps), H=heads, KV=kv_heads, D=head_dim, HALF=half,
        BLOCK=_pow2(half), QK_NORM=q_norm is not None, ROPE=rope, INTERLEAVED=interleaved,
        num_warps=1 if head_dim <= 128 else 2)
    return q_out
