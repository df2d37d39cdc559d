"""The one epilogue of every projection kernel (Triton): `act_pieces()` -> `_act_up` and `_finish`.

Owns: act(gate) * up with torch's roundings, and a row's finished float32 sums -> its output
(int8 row scales, bias, act * up) -- shared by dot_rows, split_sum and the TMA tiles
(triton_dot.py, triton_dot_tma.py) and triton_gemv's gemv, so a row's sums end alike in all
of them.  Does not own: the sums (the kernels).
"""
from __future__ import annotations

import functools


@functools.lru_cache(maxsize=None)
def act_pieces() -> dict:
    """`_act_up`, the one act(gate) * up of every projection kernel (dot_rows, split_sum and
    triton_gemv's gemv), and `_finish`, the one epilogue of dot_rows, split_sum and the TMA tiles,
    by the names the kernels call them."""
    import triton
    import triton.language as tl

    globals()["tl"] = tl                # the interpreter looks for the language in module globals

    @triton.jit
    def act_up(g, u, DT: tl.constexpr, GELU: tl.constexpr):
        """act(gate) * up from float32 sums, rounded where torch rounds: each product to the
        activation dtype DT, then the act.  One copy for every kernel here, so a row's split
        pieces summed apart (split_sum_kernel) or in the kernel (dot_rows_kernel) end alike."""
        gf = g.to(DT).to(tl.float32)
        uf = u.to(DT).to(tl.float32)
        if GELU:
            t = 0.7978845608028654 * (gf + 0.044715 * gf * gf * gf)
            a = 0.5 * gf * (1.0 + (2.0 * tl.sigmoid(2.0 * t) - 1.0))
        else:
            a = gf * tl.sigmoid(gf)
        return a.to(DT).to(tl.float32) * uf

    globals()["_act_up"] = act_up

    @triton.jit
    def finish(y, u, sy, su, b, WQ: tl.constexpr, HAS_BIAS: tl.constexpr, GLU: tl.constexpr,
               GELU: tl.constexpr, DT: tl.constexpr):
        """A row's float32 sums (all pieces) -> its output: the int8 rows' scales (sy, su), then
        the bias, then act(gate) * up -- the one epilogue of dot_rows, split_sum and the TMA
        tiles (triton_dot_tma.py)."""
        if WQ:
            y = y * sy
            if GLU:
                u = u * su
        if HAS_BIAS:
            y = y + b
        if GLU:
            y = _act_up(y, u, DT, GELU)
        return y

    return {"_act_up": act_up, "_finish": finish}
