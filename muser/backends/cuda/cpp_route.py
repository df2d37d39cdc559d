"""Which decode projections the CUDA C++ kernels take, and in what CTA shape (MUSER_DOT_CPP):
pure arithmetic on shapes, no torch, no GPU -- so the host tests pin it.  Owns the shape rules
the .cu files enforce again (gemv_mma.cu `refuse`), the shared memory each kernel asks (the
slab kernel's `smem_bytes`, norm-in's `norm_bytes`), the variants' CTA shapes, and add_norm's
(warps, BLOCK) the norm-in kernel replays.  Does not own: building, loading or calling the
kernels (cpp_dot.py), the tile table's split-K pieces (triton_dot_tiles.dot_config: the
arithmetic every kernel follows).

    variant       kernel  CTA shape
    on / norm     slab    2 warps x 1 n8 tile, else 1 x 1 (shared memory), whole slab at once
    11 21 41 ..   slab    warps x n8 tiles a warp, as two digits
"""
from __future__ import annotations

PLAIN, GLU, SPLIT = 0, 1, 2          # the kernel's three endings (gemv_mma.cu `Mode`)
MAX_ROWS = 16                        # one m16 tile of rows: a decode step's batch, a verify block
SMEM = 227 * 1024                    # an sm_90 CTA's shared memory
VARIANTS = ("11", "21", "41", "12", "22")    # warps a CTA, n8 tiles a warp (the .cu's cases)
NAMED = ("on", "norm")                       # 2 x 1, else 1 x 1; norm: with the add+norm in


def cta_shapes(variant: str) -> tuple[str, ...]:
    """The CTA shapes (warps, n8 tiles a warp) a variant tries, in order: on / norm 2 x 1 then
    1 x 1 (shared memory may be short), else the one it names."""
    return ("21", "11") if variant in NAMED else (variant,)


def norm_bytes(rows: int, k: int, pieces: int) -> int:
    """Shared memory a norm-in launch stages its inputs in (gemv_mma.cu `norm_bytes`): w_post
    and w_next float32 [k], h bf16 [rows, k], d1 bf16 [rows, k] or float32 [pieces, rows, k]."""
    return 8 * k + 2 * rows * k + (4 * pieces * rows * k if pieces else 2 * rows * k)


def smem_bytes(mode: int, warps: int, nt: int, rows: int, ks: int, wbytes: int = 2) -> int:
    """A CTA's shared memory: 128 bytes of mbarriers and the norm's scratch, then 8 * nt * warps
    weight rows (twice, gate and up, for GLU) of wbytes * ks + 16 bytes (int8 rows: 1 byte a
    weight) and the x rows of 2 * ks + 16 (the 16: the skew that spreads the banks)."""
    halves = 2 if mode == GLU else 1
    return 128 + halves * 8 * nt * warps * (wbytes * ks + 16) + rows * (2 * ks + 16)


def route(n: int, k: int, rows: int, glu: bool, gelu: bool, piece: int, defer: bool,
          variant: str, wbytes: int = 2) -> tuple[int, int, int, int] | None:
    """(mode, keys a piece, warps, n8 tiles a warp) for a projection the kernel can take with
    dot_rows' bits, else None.  n: output columns (GLU: of each half); piece: the tile table's
    split-K piece (0: none) -- a split projection only as unsummed pieces (`defer`, the add+norm
    after it sums them: MUSER_FUSE_SUM), gate|up only with GELU (the one act the .cu carries).
    variant "on" / "norm": 2 warps x 1 n8 tile, else 1 x 1, whichever fits shared memory
    first; wbytes: 1 for int8 rows."""
    if rows < 1 or rows > MAX_ROWS or n % 8 or k % 64:
        return None
    if glu:
        if not gelu or piece:
            return None
        mode, ks = GLU, k
    elif piece:
        if not defer or piece % 64 or (k % piece) % 64:
            return None
        mode, ks = SPLIT, piece
    else:
        mode, ks = PLAIN, k
    for v in cta_shapes(variant):
        warps, nt = int(v[0]), int(v[1])
        if smem_bytes(mode, warps, nt, rows, ks, wbytes) <= SMEM:
            return mode, ks, warps, nt
    return None


def norm_shape(k: int) -> tuple[int, int]:
    """(warps, BLOCK) of add_norm over rows of k keys (triton_ops._row_shape: they fix its
    reduction tree, which the kernel replays)."""
    block = 1 << max(k - 1, 0).bit_length()
    return (8 if k >= 2048 else 4), block


def norm_route(n: int, k: int, rows: int, glu: bool, gelu: bool, piece: int, pieces: int,
               variant: str, layernorm: bool, wbytes: int = 2) -> tuple[int, int, int, int] | None:
    """`route` for a projection that makes its own x (MUSER_DOT_CPP=norm): a whole-K one (qkv,
    gate|up; `piece`: the tile table's split, which must be none), an RMS norm whose BLOCK
    gives a Triton thread at least 8 keys (the layout csrc/triton_math.cuh replays: BLOCK >=
    8 x 32 x warps, so k > 512), and shared memory for the staged inputs too
    (`pieces`: the delta's split-K pieces, 0 for a bf16 delta), else None."""
    tw, block = norm_shape(k)
    if layernorm or block < 8 * 32 * tw or piece:
        return None
    glu_mode = GLU if glu else PLAIN
    for v in cta_shapes(variant):
        plan = route(n, k, rows, glu, gelu, 0, False, v, wbytes)
        if (plan is not None and plan[2] <= tw and plan[0] == glu_mode and
                smem_bytes(glu_mode, plan[2], plan[3], rows, k, wbytes) +
                norm_bytes(rows, k, pieces) <= SMEM):
            return plan
    return None


