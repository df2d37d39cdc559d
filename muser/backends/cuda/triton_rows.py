"""Fused element-wise pieces of a chunk (prefill, extend) on CUDA (Triton): rows of any count.

Owns: `norm` (RMS or layer norm over the last dim), `residual` (h + norm?(d) [+ d2], then
optionally the next norm), `norm_rope` (qk-norm and/or RoPE of x [T, N, D], every head of a
token in one program, so cos/sin are read once per token) and `act_mul` (act(gate) * up from
two row sets, strided rows allowed: separate gate/up outputs or the halves of a fused one).
`norm` and `residual` run `triton_ops.add_norm`, the decode step's kernel.
Does not own: when these are used (the CUDA backend's ops table, backends/cuda/ops.py;
MUSER_ROWS=eager switches back to the eager maths, for A/B runs), matmuls, attention.

Each op is one pass over its rows (read once, written once) where the eager maths makes
several (a float32 copy, the norm, a cast back; RoPE's ~10 element-wise ops).  Rounding is
transformer's: norm and RoPE in float32, the result cast to the activation dtype after each
(qk-norm's output is rounded before RoPE reads it), the activation rounded before the product.
Deterministic and row-invariant: one program owns whole rows, fixed reduction order, no
atomics -- a row's result does not depend on how many rows the chunk has.  Triton is imported
lazily: this module imports on a machine without it.
"""
from __future__ import annotations

import functools

import torch

from .triton_ops import add_norm
from .triton_pieces import _pow2, rope_pieces

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@functools.lru_cache(maxsize=None)
def available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


@functools.lru_cache(maxsize=None)
def _kernels():
    import triton
    import triton.language as tl

    globals().update(rope_pieces())     # module globals: the interpreter resolves names there

    @triton.jit
    def norm_rope_kernel(X, W, COS, SIN, OUT, stride_x, eps, N: tl.constexpr, D: tl.constexpr,
                         HALF: tl.constexpr, BN: tl.constexpr, BH: tl.constexpr,
                         NORM: tl.constexpr, LAYERNORM: tl.constexpr, ROPE: tl.constexpr,
                         INTERLEAVED: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)          # one token: its N heads x D
        n = tl.arange(0, BN)[:, None]
        i = tl.arange(0, BH)[None, :]
        im = i < HALF
        mask = (n < N) & im
        i0, i1 = _halves(i, HALF, INTERLEAVED)
        src = X + t * stride_x + n * D
        x0 = tl.load(src + i0, mask=mask, other=0.0)
        x1 = tl.load(src + i1, mask=mask, other=0.0)
        dt = x0.dtype
        a0 = x0.to(tl.float32)
        a1 = x1.to(tl.float32)
        if NORM:
            w0 = tl.load(W + i0, mask=im, other=0.0).to(tl.float32)
            w1 = tl.load(W + i1, mask=im, other=0.0).to(tl.float32)
            if LAYERNORM:
                mean = ((tl.sum(a0, 1) + tl.sum(a1, 1)) / D)[:, None]
                a0 = tl.where(mask, a0 - mean, 0.0)
                a1 = tl.where(mask, a1 - mean, 0.0)
            r = tl.rsqrt((tl.sum(a0 * a0, 1) + tl.sum(a1 * a1, 1)) / D + eps)[:, None]
            a0 = (a0 * r * w0).to(dt).to(tl.float32)
            a1 = (a1 * r * w1).to(dt).to(tl.float32)
        if ROPE:
            c = tl.load(COS + t * HALF + i, mask=im, other=0.0)
            s = tl.load(SIN + t * HALF + i, mask=im, other=0.0)
            o0, o1 = _rotate(a0, a1, c, s)
        else:
            o0 = a0
            o1 = a1
        dst = OUT + t * (N * D) + n * D
        tl.store(dst + i0, o0.to(dt), mask=mask)
        tl.store(dst + i1, o1.to(dt), mask=mask)

    @triton.jit
    def act_mul_kernel(G, U, OUT, stride_g, stride_u, I: tl.constexpr, BLOCK: tl.constexpr,
                       GELU: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = i < I
        g = tl.load(G + t * stride_g + i, mask=mask, other=0.0)
        u = tl.load(U + t * stride_u + i, mask=mask, other=0.0)
        gf = g.to(tl.float32)
        if GELU:                                   # tanh(y) = 2 sigmoid(2y) - 1
            y = 0.7978845608028654 * (gf + 0.044715 * gf * gf * gf)
            a = 0.5 * gf * (1.0 + (2.0 * tl.sigmoid(2.0 * y) - 1.0))
        else:
            a = gf * tl.sigmoid(gf)
        out = a.to(g.dtype).to(tl.float32) * u.to(tl.float32)
        tl.store(OUT + t * I + i, out.to(g.dtype), mask=mask)

    return norm_rope_kernel, act_mul_kernel


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as contiguous rows [M, last dim] (a view when x is contiguous)."""
    return x.contiguous().view(-1, x.shape[-1])


def norm(x: torch.Tensor, w: torch.Tensor, eps: float, layernorm: bool) -> torch.Tensor:
    """Norm of x [..., N] over N with w [N], in float32; x's shape and dtype, contiguous."""
    if x.numel() == 0:
        return torch.empty_like(x, memory_format=torch.contiguous_format)
    return add_norm(_rows(x), w, eps, layernorm)[1].view(x.shape)


def residual(h: torch.Tensor, d: torch.Tensor, eps: float, layernorm: bool,
             w_post: torch.Tensor | None = None, w_next: torch.Tensor | None = None,
             d2: torch.Tensor | None = None):
    """h' = h + norm(d, w_post) (plain d without w_post) [+ d2], rounded to h's dtype after each
    add; x = norm(h', w_next) or None.  h, d, d2 [T, N] of one dtype -> (h', x), new tensors."""
    if h.numel() == 0:
        return h.clone(), (None if w_next is None else h.clone())
    return add_norm(_rows(h), w_next, eps, layernorm, d1=_rows(d),
                    d2=None if d2 is None else _rows(d2), w_post=w_post)


def norm_rope(x: torch.Tensor, w: torch.Tensor | None, eps: float, layernorm: bool,
              cos: torch.Tensor | None = None, sin: torch.Tensor | None = None,
              interleaved: bool = False) -> torch.Tensor:
    """x [T, N, D] (token rows may be strided; D even) -> contiguous [T, N, D], x's dtype:
    norm over D with w [D] when given, then RoPE by cos/sin float32 [T, D/2] when given."""
    T, N, D = x.shape
    if x.stride(2) != 1 or (N > 1 and x.stride(1) != D):
        x = x.contiguous()
    out = torch.empty((T, N, D), dtype=x.dtype, device=x.device)
    rope = cos is not None
    if rope:
        if cos.shape != (T, D // 2) or sin.shape != (T, D // 2) or cos.dtype != torch.float32:
            raise ValueError(f"cos/sin must be float32 [{T}, {D // 2}], got {cos.dtype} "
                             f"{tuple(cos.shape)} / {tuple(sin.shape)}")
        cos, sin = cos.contiguous(), sin.contiguous()
    if T == 0 or (w is None and not rope):
        return out.copy_(x)
    half = D // 2
    bn, bh = _pow2(N), _pow2(half)
    _kernels()[0][(T,)](x, w if w is not None else x, cos if rope else x, sin if rope else x, out,
                        x.stride(0), float(eps), N=N, D=D, HALF=half, BN=bn, BH=bh,
                        NORM=w is not None, LAYERNORM=layernorm, ROPE=rope,
                        INTERLEAVED=interleaved, num_warps=max(1, min(8, bn * bh // 256)))
    return out


def act_mul(gate: torch.Tensor, up: torch.Tensor, gelu: bool) -> torch.Tensor:
    """act(gate) * up for gate, up [T, I] (rows may be strided) -> contiguous [T, I], gate's dtype;
    act = gelu (tanh approximation) or silu, rounded to the dtype before the product."""
    if gate.stride(-1) != 1:
        gate = gate.contiguous()
    if up.stride(-1) != 1:
        up = up.contiguous()
    T, inter = gate.shape
    out = gate.new_empty(T, inter)
    if out.numel() == 0:
        return out
    block = 1024
    _kernels()[1][(T, -(-inter // block))](gate, up, out, gate.stride(0), up.stride(0), I=inter,
                                           BLOCK=block, GELU=gelu, num_warps=4)
    return out
