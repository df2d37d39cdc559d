"""The o projection inside the decode attention launch (Triton; MUSER_ATTN_O, an experiment).

Owns: `o_pieces()` -> `_o_done` (a row's attention output stored: count it), `_wait_for` (spin
on a counter, then acquire) and `_o_tile` (one output tile of o = attention @ wo.T for every
row of the step, by a program of the launch's o row, once every row is counted).  Does not own: the attention (triton_decode_kernel.py, which
calls these), the grid and its buffers (triton_decode.py), when the step takes it
(decode_step.py).

Why: at one row the attention keeps ~17 SMs busy for ~10 us, and then the o launch and its
boundary follow (1B: 4.38 us under ncu).  The o row's programs are launched with the attention,
wait on a counter instead of a launch boundary, and read o's weights from the L2 that the
prefetch row filled.  Each tile is dot_rows' own decode tile -- `_piece` (the k16 chain in
order) and `_finish` -- so o's values are bit for bit the o launch's.

    grid rows:  [ B * KV attention rows | prefetch row (NPF) | o row: NO programs ]
    a row's last merger:  store O, barrier, ODN[0] += 1 (release)
    o program s:          wait ODN[0] == B * KV (acquire), tile s of o, ODN[1] += 1;
                          the last one sets both counters back to 0

The o programs spin while the attention runs: every one of them and every live attention
program must be resident at once, so the step takes it in one-row-tile steps only (B <= 16:
NO + B * KV * splits programs against ~396 slots on an H200).  Under Triton's interpreter the
grid runs row after row, so the o row finds every count in.
"""
from __future__ import annotations

import functools


@functools.lru_cache(maxsize=None)
def o_pieces() -> dict:
    import triton
    import triton.language as tl

    from . import triton_dot
    triton_dot._kernels()                # defines _piece / _finish in triton_dot's globals
    globals()["tl"] = tl                 # the interpreter looks for the language in module globals
    for name in ("_piece", "_finish"):
        globals()[name] = getattr(triton_dot, name)

    @triton.jit
    def wait_for(cnt, n):
        """Spin until the counter reaches n, then acquire (the producers' stores are visible).
        The spin reads with volatile loads, not atomics: programs waiting must not queue
        read-modify-writes on one L2 line beside the stores they wait for."""
        while tl.load(cnt, volatile=True) < n:
            pass
        # the acquire: a compare-and-swap that never swaps (counts are >= 0) -- Triton drops an
        # atomic add of 0 (sm_90 PTX: it did, acquire and all); its value is used as well
        seen = tl.atomic_cas(cnt, -1, -1, sem="acquire", scope="gpu")
        while seen < n:
            seen = tl.atomic_cas(cnt, -1, -1, sem="acquire", scope="gpu")

    globals()["_wait_for"] = wait_for

    @triton.jit
    def o_done(ODN):
        """A row's attention output is stored (by this program's threads): count it."""
        tl.debug_barrier()
        tl.atomic_add(ODN, 1, sem="release", scope="gpu")

    @triton.jit
    def o_tile(O, WO, BO, YO, ODN, s, B, NROWS, K: tl.constexpr, ON: tl.constexpr,
               OBN: tl.constexpr, OBK: tl.constexpr, ONO: tl.constexpr, OBIAS: tl.constexpr):
        """Tile s of YO [B, ON] = O [B, K] @ WO[ON, K].T (+ BO), once all NROWS rows are in."""
        _wait_for(ODN, NROWS)
        cols = s * OBN + tl.arange(0, OBN)
        cm = cols < ON
        rm = tl.arange(0, 16)
        acc, accu = _piece(O, WO, rm, rm < B, cols, cm, 0, ON, K, ((K + OBK - 1) // OBK) * OBK,
                           OBN, OBK, False, 16, None, False, True)
        b = 0.0
        if OBIAS:
            b = tl.load(BO + cols, mask=cm, other=0.0).to(tl.float32)[None, :]
        y = _finish(acc, acc, 1.0, 1.0, b, False, OBIAS, False, False, O.dtype.element_ty)
        tl.store(YO + rm[:, None].to(tl.int64) * ON + cols[None, :], y.to(YO.dtype.element_ty),
                 mask=(rm < B)[:, None] & cm[None, :])
        done = tl.atomic_add(ODN + 1, 1, sem="acq_rel", scope="gpu")
        if done == ONO - 1:                  # every o program is past its wait
            tl.store(ODN, 0)
            tl.store(ODN + 1, 0)

    return {"_o_done": o_done, "_o_tile": o_tile}
