"""int8 weights on CUDA (`muser.load(..., device="cuda", quant="int8")`): every dense projection
and the head as int8 rows with a float32 scale per row, dequantized inside `dot_rows`' tiles;
`quant="int8-head"`: the head alone (the one projection a decode step reads at the bandwidth
floor; the rest are latency-bound, where int8 bought nothing -- benchmarks/NOTES.md), as
`BlockInt8`: GGUF's Q8_0 layout, a float16 scale per 32 keys, each weight dequantized to the
activation dtype in the tile -- a head stored as Q8_0 (the embedded 270M's) comes back exactly,
so its logits are the bf16 engine's bit for bit (H200, benchmarks/q8_head_check.py), at 8.5 bits
a weight instead of 16.  The tile that keeps those bits (the bf16 tile's MMA layout,
triton_dot_loads.py) runs the head in bf16's time on an H200 and faster on an H100 (a 1B-shape
step -61 us); `exact_blocks` finds such a head, for CUDA's default (defaults.default_head).
`quant="int8-head-fast"`: the head alone as `HeadInt8` -- int8 rows read in the tensor core's
own int8 layout (no fence), every row of every path through the one 16-row decode tile, so the
logits are the mode's own (not bf16's: the row scale rounds) but one arithmetic per token within
it; time, not only memory.

Owns: `RowInt8` (what `dot_rows(x, q, scale=s)` takes), `quantize_rows`, `quantize_blocks`,
`exact_blocks`, `EmbedBlocks` and `keep_exact_blocks`, `quantize_weights` and `why_not_int8`
(what the mode needs: the fused decode step, its exact chunks, no experts).  Does not own: the
kernel (triton_dot.py: int8 -> the activation dtype in registers, exact for |q| <= 127; the dot
is the bf16 one; the scale multiplies each float32 sum once all its split-K pieces are in -- so
the rows stay invariant, as with bf16 weights), the accuracy contract
(benchmarks/gpu_weight_accuracy.py on the embedded 270M against float32: KL 5.0e-3, top-1
0.966, the CPU default's 5.2e-3 / 0.961; bf16 weights: 6.5e-5).

    w [N, K] float  ->  scale[n] = max_k |w[n, k]| / 127,  q[n, k] = round(w[n, k] / scale[n])
    y[b, n] = (sum_k x[b, k] * q[n, k]) * scale[n]    (+ bias)

The embedding lookup keeps its float table and a tied head gets its own int8 copy -- except a
tied head whose blocks are exact (`keep_exact_blocks`): its rows are the table's bit for bit, so
the lookup reads them too (`EmbedBlocks`) and the float table is dropped (the 270M: 335 -> 178
MB).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...config import HEAD_ONLY

PROJECTIONS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
# the int8-row mode's own arithmetic, in its cut encoding (CudaBackend.encoding_tag):
#   1: seventh session (int8 rows in dot_rows' tiles)
#   2: thirty-seventh session (the decode tile behind the layout fence: it summed k permuted,
#      apart from the chunk tiles -- rows decoded before this are not the rows computed now)
INT8_ROWS = 2


@dataclass(frozen=True)
class RowInt8:
    """An [N, K] matrix as int8 rows and float32 row scales (W = scale[:, None] * q)."""
    q: torch.Tensor          # int8 [N, K]
    scale: torch.Tensor      # float32 [N]

    @property
    def shape(self) -> torch.Size:
        return self.q.shape

    def is_contiguous(self) -> bool:
        return self.q.is_contiguous() and self.scale.is_contiguous()

    def nbytes(self) -> int:
        return self.q.numel() + 4 * self.scale.numel()

    def dequantized(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """W as the kernel sees it, up to the order of the scale (a reference, tests)."""
        return (self.q.float() * self.scale[:, None]).to(dtype)


@dataclass(frozen=True)
class HeadInt8(RowInt8):
    """The head as int8 rows (quant="int8-head-fast"), computed where the layout fence would
    cost time: `DecodeStep._dot` sends every row -- a decode step's, a verify block's, a
    chunk's last -- through dot_rows' 16-row decode tile without the fence, the int8 operand
    in Triton's own layout (four k a lane, TTGIR kWidth 4), which sums k in an order no chunk
    tile shares.  One tile for every row is what keeps the logits one arithmetic per token;
    the K/V rows never see the head, so they are the float weights' (and so are the cuts)."""


BLOCK = 32                   # keys a BlockInt8 scale covers (GGUF's Q8_0 block)


@dataclass(frozen=True)
class BlockInt8(RowInt8):
    """An [N, K] matrix as int8 rows in blocks of BLOCK keys, each with a float16 scale:
    W[n, k] = dtype(q[n, k] * scale[n, k // BLOCK]), the product exact in float32 (7 + 11 bits),
    one rounding to the activation dtype -- what `dot_rows` computes in its tile before the dot,
    so any tile gives the same bits.  A RowInt8 for every rule that asks "int8 rows?"."""
    # q: int8 [N, K]; scale: float16 [N, K // BLOCK]

    def nbytes(self) -> int:
        return self.q.numel() + 2 * self.scale.numel()

    def dequantized(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """W exactly as the kernel's tile holds it when `dtype` is the activation dtype: each
        q * s exact in float32 (8-bit q, 11-bit s), then one rounding."""
        N, K = self.q.shape
        w = self.q.float().view(N, K // BLOCK, BLOCK) * self.scale.float()[..., None]
        return w.view(N, K).to(dtype)


@dataclass(frozen=True)
class EmbedBlocks:
    """The embedding table as a tied head's exact Q8_0 blocks (`keep_exact_blocks`): row t is
    dtype(q[t] * scale[t]) -- exact_blocks compared every row of it with the float table, bit
    for bit, so a lookup here is the float table's lookup and that table can go.  Read by
    `triton_ops.embed_norm` (the step's launch, decode rows and exact chunks alike: the same
    dequantization in the kernel) and `transformer.embed` (the eager path: `rows`).  Its bytes
    are the head's: weights.lm_head holds the same blocks and counts them."""
    blocks: BlockInt8
    dtype: torch.dtype           # the activation dtype the rows come back in

    @property
    def shape(self) -> torch.Size:
        return self.blocks.q.shape

    @property
    def device(self) -> torch.device:
        return self.blocks.q.device

    def nbytes(self) -> int:
        return 0                 # (weights.lm_head's)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [T] -> [T, K] in `dtype`: F.embedding of the float table, bit for bit."""
        return BlockInt8(self.blocks.q[ids], self.blocks.scale[ids]).dequantized(self.dtype)


def quantize_rows(w: torch.Tensor) -> RowInt8:
    """Symmetric int8 per row (gpu_weight_accuracy.py's `int8-row`); all-zero rows scale 1e-12/127."""
    wf = w.float()
    scale = wf.abs().amax(1).clamp_min(1e-12) / 127
    q = (wf / scale[:, None]).round().clamp(-127, 127).to(torch.int8)
    return RowInt8(q.contiguous(), scale.contiguous())


# f16 ulps tried on either side of max|w| / 127 for a block held in a 16-bit dtype (below)
NEAR = 6
ROWS_AT_ONCE = 16384


def _scales_q(g: torch.Tensor, s: torch.Tensor):
    """int8 q of blocks g [..., BLOCK] at float16 scales s [..., 1] (0: an all-zero block)."""
    sf = s.float()
    q = torch.where(sf > 0, g / sf.clamp_min(torch.finfo(torch.float32).tiny), torch.zeros_like(g))
    return q.round().clamp(-127, 127)


def _exact_scales(g: torch.Tensor, s: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Per block, the first float16 scale of s, s + 1 ulp, s - 1 ulp, .. (NEAR each way) whose
    dtype(q * scale) gives the block's values back exactly; s where none does."""
    best, found = s.clone(), torch.zeros_like(s, dtype=torch.bool)
    bits = s.view(torch.int16)
    for k in [0] + [d for j in range(1, NEAR + 1) for d in (j, -j)]:
        c = (bits + k).view(torch.float16)
        live = (s > 0) & torch.isfinite(c) & (c > 0) & ~found
        q = _scales_q(g, c)
        ok = live & ((q * c.float()).to(dtype).float() == g).all(-1, keepdim=True)
        best = torch.where(ok, c, best)
        found |= ok
        if bool((found | (s <= 0)).all()):        # every block with a scale has its exact one
            break
    return best


def quantize_blocks(w: torch.Tensor) -> BlockInt8:
    """Q8_0: symmetric int8 a block of BLOCK keys, scale ~ max|w| / 127 as float16 (an all-zero
    block scales 0 and stores 0).  Values that came from Q8_0 come back exactly: the block's
    largest is +-127 * d, so the scale is d and every q its own.  A weight already held in a
    16-bit dtype (the engine casts before its backend quantizes: bf16(q * d), rounded) has lost
    that: its scale is sought among the float16 values near max|w| / 127 for one whose
    w.dtype(q * scale) -- what the tile computes -- is w again (`_exact_scales`; d is within a
    few ulps, since a rounding of 2^-9 moves 127 * d by no more); so a Q8_0 head cast to bf16
    is the bf16 head in the tile, bit for bit."""
    n, k = w.shape
    if k % BLOCK:
        raise ValueError(f"block int8 needs rows of a multiple of {BLOCK} keys, got {k}")
    qs, ss = [], []
    for r in range(0, n, ROWS_AT_ONCE):              # a 262k-row head: bounded temporaries
        g = w[r:r + ROWS_AT_ONCE].float().reshape(-1, k // BLOCK, BLOCK)
        s = (g.abs().amax(2, keepdim=True) / 127).to(torch.float16)
        if not torch.isfinite(s).all():
            raise ValueError(f"block int8: a block's scale overflows float16 (largest weight "
                             f"{float(g.abs().max()):.3g}, at most {65504 * 127:.3g})")
        if w.dtype in (torch.bfloat16, torch.float16):
            s = _exact_scales(g, s, w.dtype)
        qs.append(_scales_q(g, s).to(torch.int8).reshape(-1, k))
        ss.append(s.reshape(-1, k // BLOCK))
    return BlockInt8(torch.cat(qs).contiguous(), torch.cat(ss).contiguous())


# rows of a head tried before the whole of it (exact_blocks): spread over the head, enough that
# a head never stored as Q8_0 fails there (a random bf16 block comes back exactly ~never)
SAMPLE_ROWS = 256


def exact_blocks(w: torch.Tensor) -> BlockInt8 | None:
    """w's Q8_0 blocks if they give w back bit for bit in its own dtype -- a head stored as
    Q8_0 and cast to bf16 / f16 at load (the embedded 270M's) -- else None.  A spread sample
    of rows is tried first, so a head that never was Q8_0 costs a sample's search, not the
    head's.  The whole head is then compared in bounded slices (a 4B head dequantized to
    float32 at once would be 2.7 GB)."""
    def same_bits(a, b):                    # -0.0 is not +0.0 here (torch.equal says it is)
        return torch.equal(a.view(torch.int16), b.view(torch.int16))

    n, k = w.shape
    if k % BLOCK or w.dtype not in (torch.bfloat16, torch.float16):
        return None
    sample = w[::max(1, n // SAMPLE_ROWS)][:SAMPLE_ROWS]
    try:
        if not same_bits(quantize_blocks(sample).dequantized(w.dtype), sample):
            return None
        blocks = quantize_blocks(w)
    except ValueError:                                  # a scale past float16: not Q8_0
        return None
    for r in range(0, n, ROWS_AT_ONCE):
        part = BlockInt8(blocks.q[r:r + ROWS_AT_ONCE], blocks.scale[r:r + ROWS_AT_ONCE])
        if not same_bits(part.dequantized(w.dtype), w[r:r + ROWS_AT_ONCE]):
            return None
    return blocks


def keep_exact_blocks(weights) -> bool:
    """The head as its Q8_0 blocks if they give it back bit for bit (exact_blocks) -- a tied
    head's lookup reading them too (EmbedBlocks), its float table dropped -- and True; else
    the weights untouched and False."""
    blocks = exact_blocks(weights.output)
    if blocks is None:
        return False
    if weights.lm_head is None:
        weights.embed = EmbedBlocks(blocks, weights.embed.dtype)
    weights.lm_head = blocks
    return True


def quantize_weights(weights, quant: str = "int8") -> None:
    """In place, for `quant`: "int8" -- every layer's dense projections and the head
    (`lm_head`, a tied one too) as RowInt8; "int8-head" -- the head alone, as BlockInt8;
    "int8-head-fast" -- the head alone, as HeadInt8.  The head-only modes leave the layers
    their float weights, so every K/V row is the float mode's and only the logits move."""
    if quant == "int8-head":
        # (the loader's default may have kept them already)
        if not isinstance(weights.lm_head, BlockInt8) and not keep_exact_blocks(weights):
            weights.lm_head = quantize_blocks(weights.output)
        return
    if quant == "int8-head-fast":
        rows = quantize_rows(weights.output)
        weights.lm_head = HeadInt8(rows.q, rows.scale)
        return
    if quant != "int8":
        raise ValueError(f"no CUDA int8 weight mode {quant!r} "
                         f"({', '.join(('int8',) + HEAD_ONLY)})")
    for lw in weights.layers:
        for name in PROJECTIONS:
            w = getattr(lw, name)
            if isinstance(w, torch.Tensor):
                setattr(lw, name, quantize_rows(w))
    weights.lm_head = quantize_rows(weights.output)


def why_not_int8(spec, weights, env) -> str | None:
    """Why int8 weights cannot run this model on CUDA (None: they can).  Only the fused decode
    step and its chunk pass read RowInt8; every other path would meet a matrix it cannot use."""
    from .step_weights import unsupported
    why = unsupported(spec)
    if why:
        return f"the fused decode step does not take this model ({why})"
    if any(lw.moe is not None for lw in weights.layers):
        return "experts (no int8 expert kernels on CUDA)"
    if weights.per_layer_proj is not None:
        return "per-layer input embeddings"
    if env.chunks != "exact" or env.gemv != "dot" or env.attn != "fused":
        return (f"the default kernels (MUSER_CHUNKS=exact, MUSER_GEMV=dot, MUSER_ATTN=fused), got "
                f"{env.chunks}, {env.gemv}, {env.attn}")
    return None
