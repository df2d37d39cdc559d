"""A layer's output projection and MLP half as one persistent launch (Triton): issue 17 item 6.

Owns: `mlp_block` -- optionally the attention's output projection o (its tiles first), then
add+norm (h + norm(o), then the MLP's input norm), the gate|up
projection with act * up, the down projection, add+norm again (h + norm(down), then the next
layer's input norm): the decode step's four launches for that half, as tasks of one launch
whose programs loop over a static task list, waiting on counters in global memory for the
tasks they depend on.  Each task is the code its kernel runs today -- `_add_norm_tail`,
`_piece` / `_finish` (triton_ops.py, triton_dot.py) with the same tiles, and the down
projection's split-K pieces summed in order as `add_pieces_norm_kernel` sums them -- so each
output is
meant to be the four launches' bitwise (`tests/cuda/test_triton_mega.py`).  Not wired into the
decode step: `benchmarks/mega_probe.py` measures it against the four launches first
(benchmarks/NOTES.md, "Item 6").  Does not own: the tiles (triton_dot_tiles.py), the step.

The task list, in order (a program takes tasks pid, pid + P, ...; every task's producers come
before it, and each program finishes its earlier tasks before it waits, so with all P
programs resident there is no deadlock):

    [ o tiles | B add+norm | gate|up tiles | down tiles x pieces | B add+norm | next qkv tiles ]
      c4 += 1   waits c4,    waits c0,        waits c1,            waits c2,    waits c3,
                c0 += 1      c1 += 1          c2 += 1              c3 += 1      c5 += 1
    (o and the next layer's qkv optional); the very last task sets every counter back to 0
"""
from __future__ import annotations

import functools

import torch

from .triton_dot import _kernels as _dot_kernels
from .triton_dot_epilogue import act_pieces
from .triton_dot_tiles import dot_config
from .triton_pieces import _pow2, norm_pieces


@functools.lru_cache(maxsize=None)
def _kernel():
    import triton
    import triton.language as tl

    _dot_kernels()                       # defines _piece / _finish in triton_dot's globals
    from . import triton_dot
    globals()["tl"] = tl
    globals().update(act_pieces())
    for name in ("_piece", "_finish"):
        globals()[name] = getattr(triton_dot, name)
    globals()["_add_norm_tail"] = norm_pieces()["_add_norm_tail"]

    @triton.jit
    def wait_for(cnt, n):
        """Spin until the counter reaches n, then acquire (the producers' stores are visible).
        The spin reads with volatile loads, not atomics: a hundred programs waiting must not
        queue read-modify-writes on one L2 line beside the tasks they wait for."""
        while tl.load(cnt, volatile=True) < n:
            pass
        # the acquire: a compare-and-swap that never swaps (counts are >= 0) -- Triton drops an
        # atomic add of 0 (sm_90 PTX: it did, acquire and all); its value is used as well
        seen = tl.atomic_cas(cnt, -1, -1, sem="acquire", scope="gpu")
        while seen < n:
            seen = tl.atomic_cas(cnt, -1, -1, sem="acquire", scope="gpu")

    globals()["_wait_for"] = wait_for

    @triton.jit
    def tile_rows(X, W, Y, rm, B, tile, NOUT: tl.constexpr, K: tl.constexpr, KS: tl.constexpr,
                  BN: tl.constexpr, BK: tl.constexpr, GLU: tl.constexpr, GELU: tl.constexpr):
        """Output tile `tile` of rows X [B, K] through W, stored to Y [B, NOUT]: dot_rows'
        decode tile without split-K pieces, as its kernel computes it."""
        cols = tile * BN + tl.arange(0, BN)
        cm = cols < NOUT
        acc, accu = _piece(X, W, rm, rm < B, cols, cm, 0, NOUT, K, KS, BN, BK, GLU, 16)
        y = _finish(acc, accu, 1.0, 1.0, 0.0, False, False, GLU, GELU, X.dtype.element_ty)
        tl.store(Y + rm[:, None].to(tl.int64) * NOUT + cols[None, :], y.to(Y.dtype.element_ty),
                 mask=(rm < B)[:, None] & cm[None, :])

    globals()["_tile_rows"] = tile_rows

    @triton.jit
    def mlp_block_kernel(H, O, W_PA, W_PF, GU, DW, W_PD, W_NX, H1, X1, A, D, P, H2, X2, CNT, B,
                         eps, AT, WO, WQ, QKV,
                         N: tl.constexpr, F: tl.constexpr, BLOCK: tl.constexpr,
                         HD: tl.constexpr, BN0: tl.constexpr, BK0: tl.constexpr,
                         KS0: tl.constexpr, T0: tl.constexpr, NQ: tl.constexpr,
                         BNQ: tl.constexpr, BKQ: tl.constexpr, KSQ: tl.constexpr,
                         T5: tl.constexpr,
                         BN1: tl.constexpr, BK1: tl.constexpr, KS1: tl.constexpr,
                         BN2: tl.constexpr, BK2: tl.constexpr, KS2: tl.constexpr,
                         POST: tl.constexpr, LAYERNORM: tl.constexpr, NEXT: tl.constexpr,
                         GELU: tl.constexpr, NPROG: tl.constexpr, T1: tl.constexpr,
                         T2: tl.constexpr, PIECES: tl.constexpr):
        pid = tl.program_id(0)
        total = T0 + 2 * B + T1 + T2 + T5
        i = tl.arange(0, BLOCK)
        mask = i < N
        rm = tl.arange(0, 16)
        for tt in range(pid, total, NPROG):
            t = tt - T0                                 # T0 > 0: the o projection's tiles first
            if tt < T0:                                 # o = att @ wo (a tile)
                _tile_rows(AT, WO, O, rm, B, tt, N, HD, KS0, BN0, BK0, False, False)
                tl.debug_barrier()
                tl.atomic_add(CNT + 4, 1, sem="release", scope="gpu")
            elif t < B:                                 # h1 = h + norm(o); x1 = norm(h1)
                if T0 > 0:
                    _wait_for(CNT + 4, T0)
                row_n1 = t
                h_n1 = tl.load(H + row_n1 * N + i, mask=mask, other=0.0)
                d1_n1 = tl.load(O + row_n1 * N + i, mask=mask, other=0.0).to(tl.float32)
                _add_norm_tail(h_n1, d1_n1, row_n1, i, mask, H, W_PA, W_PF, H1, X1, eps, N,
                                   True, False, POST, LAYERNORM, True)
                tl.debug_barrier()
                tl.atomic_add(CNT + 0, 1, sem="release", scope="gpu")
            elif t < B + T1:                            # a = act(x1 @ gate) * (x1 @ up)
                _wait_for(CNT + 0, B)
                _tile_rows(X1, GU, A, rm, B, t - B, F, N, KS1, BN1, BK1, True, GELU)
                tl.debug_barrier()
                tl.atomic_add(CNT + 1, 1, sem="release", scope="gpu")
            elif t < B + T1 + T2:                       # d = a @ down (a tile, or a piece)
                _wait_for(CNT + 1, T1)
                u_dn = t - B - T1
                cols_dn = (u_dn // PIECES) * BN2 + tl.arange(0, BN2)
                cm_dn = cols_dn < N
                om_dn = (rm < B)[:, None] & cm_dn[None, :]
                acc_dn, accu_dn = _piece(A, DW, rm, rm < B, cols_dn, cm_dn, u_dn % PIECES, N, F,
                                         KS2, BN2, BK2, False, 16)
                if PIECES > 1:                          # split-K: the piece's float32 sums
                    prow = ((u_dn % PIECES) * B + rm[:, None]).to(tl.int64)
                    tl.store(P + prow * N + cols_dn[None, :], acc_dn, mask=om_dn)
                else:
                    y_dn = _finish(acc_dn, acc_dn, 1.0, 1.0, 0.0, False, False, False, False,
                                   A.dtype.element_ty)
                    tl.store(D + rm[:, None].to(tl.int64) * N + cols_dn[None, :],
                             y_dn.to(D.dtype.element_ty), mask=om_dn)
                tl.debug_barrier()
                tl.atomic_add(CNT + 2, 1, sem="release", scope="gpu")
            elif t < 2 * B + T1 + T2:                   # h2 = h1 + norm(d); x2 = norm(h2)
                _wait_for(CNT + 2, T2)
                row_n2 = t - B - T1 - T2
                h_n2 = tl.load(H1 + row_n2 * N + i, mask=mask, other=0.0)
                if PIECES > 1:                          # add_pieces_norm's sum: in order, then
                    ysum_n2 = tl.zeros((BLOCK,), dtype=tl.float32)    # rounded to the dtype
                    for pc in range(PIECES):
                        ysum_n2 += tl.load(P + (pc * B + row_n2) * N + i, mask=mask, other=0.0)
                    d1_n2 = ysum_n2.to(h_n2.dtype).to(tl.float32)
                else:
                    d1_n2 = tl.load(D + row_n2 * N + i, mask=mask, other=0.0).to(tl.float32)
                _add_norm_tail(h_n2, d1_n2, row_n2, i, mask, H1, W_PD, W_NX, H2, X2, eps, N,
                                   True, False, POST, LAYERNORM, NEXT)
                tl.debug_barrier()
                done_n2 = tl.atomic_add(CNT + 3, 1, sem="acq_rel", scope="gpu")
                if T5 == 0:
                    if done_n2 == B - 1:                   # the last task: counters back to zero
                        for c in range(6):
                            tl.store(CNT + c, 0)
            else:                                       # the next layer's qkv = x2 @ wqkv
                _wait_for(CNT + 3, B)
                _tile_rows(X2, WQ, QKV, rm, B, t - 2 * B - T1 - T2, NQ, N, KSQ, BNQ, BKQ, False,
                           False)
                tl.debug_barrier()
                done_q = tl.atomic_add(CNT + 5, 1, sem="acq_rel", scope="gpu")
                if done_q == T5 - 1:                      # the last task: counters back to zero
                    for c in range(6):
                        tl.store(CNT + c, 0)

    return mlp_block_kernel


def _tile(n: int, k: int, glu: bool, what: str) -> tuple[int, int, int, int]:
    """(block_n, block_k, keys, tiles) of a decode tile without split-K pieces (dot_config's);
    mlp_block refuses a tile with pieces where it does not sum them."""
    bn, bk, _, _, piece = dot_config(n, k, glu)
    if piece:
        raise ValueError(f"mlp_block needs a {what} tile without split-K pieces, got {piece}")
    return bn, bk, -(-k // bk) * bk, -(-n // bn)


def mlp_block(h, o, w_post_attn, w_pre_ffn, gate_up, down, w_post_ffn, w_next, eps: float,
              layernorm: bool = False, gelu: bool = True, programs: int | None = None,
              out: dict | None = None, att=None, wo=None, wqkv=None):
    """The MLP half of a decode layer in one launch: returns (h2, x2) as
    `add_norm(h1, w_next, d1=down(act(gate_up(x1))), w_post=w_post_ffn)` after
    `h1, x1 = add_norm(h, w_pre_ffn, d1=o, w_post=w_post_attn)` -- B <= 16 rows, bf16 weights;
    a down projection with split-K pieces leaves them for the last add+norm to sum in order, as
    MUSER_FUSE_SUM's `add_norm(d1=Pieces)` does (the gate|up tile must have none).  With `att`
    (the attention's rows [B, H * D]) and `wo`, o is their product, as `dot_rows(att, wo)`,
    computed in the same launch (pass o=None).  With `wqkv` (the next layer's fused q|k|v rows,
    no bias), its projection of x2 comes last and is returned third.  `programs`: the
    persistent grid (default: the GPU's multiprocessors; 1 under the interpreter, whose
    programs run one after another)."""
    B, N = h.shape
    F = down.shape[1]
    if B > 16:
        raise ValueError(f"mlp_block takes up to 16 rows, got {B}")
    bn1, bk1, ks1, t1 = _tile(F, N, True, "gate|up")
    bn2, bk2, _, _, p2 = dot_config(N, F, False)
    pieces = -(-F // p2) if p2 else 1
    o_ = out if out is not None else {}
    buf = {k: o_[k] if o_.get(k) is not None
           else torch.empty(shape, dtype=h.dtype, device=h.device)
           for k, shape in (("h1", (B, N)), ("x1", (B, N)), ("a", (B, F)), ("d", (B, N)),
                            ("h2", (B, N)), ("x2", (B, N)))}
    cnt = o_.get("cnt")
    if cnt is None:
        cnt = torch.zeros(6, dtype=torch.int32, device=h.device)
    t0, hd, bn0, bk0, ks0 = 0, 16, 16, 16, 16            # no o tiles (placeholders)
    if att is not None:
        hd = att.shape[1]
        bn0, bk0, ks0, t0 = _tile(N, hd, False, "o")
        o = torch.empty((B, N), dtype=h.dtype, device=h.device)
    t5, nq, bnq, bkq, ksq, qkv = 0, 16, 16, 16, 16, None  # no qkv tiles (placeholders)
    if wqkv is not None:
        if w_next is None:
            raise ValueError("mlp_block: the next layer's qkv needs x2 (w_next)")
        nq = wqkv.shape[0]
        bnq, bkq, ksq, t5 = _tile(nq, N, False, "qkv")
        qkv = torch.empty((B, nq), dtype=h.dtype, device=h.device)
    if programs is None:
        programs = (torch.cuda.get_device_properties(h.device).multi_processor_count
                    if h.is_cuda else 1)
    ks2 = p2 if pieces > 1 else -(-F // bk2) * bk2
    part = (torch.empty((pieces, B, N), dtype=torch.float32, device=h.device) if pieces > 1
            else buf["d"])
    post = w_post_attn is not None
    _kernel()[(programs,)](
        h, o, w_post_attn if post else w_pre_ffn, w_pre_ffn, gate_up, down,
        w_post_ffn if post else w_pre_ffn, w_next if w_next is not None else w_pre_ffn,
        buf["h1"], buf["x1"], buf["a"], buf["d"], part, buf["h2"], buf["x2"], cnt, B, float(eps),
        att if att is not None else h, wo if wo is not None else gate_up,
        wqkv if wqkv is not None else gate_up, qkv if qkv is not None else h,
        N=N, F=F, BLOCK=_pow2(N), HD=hd, BN0=bn0, BK0=bk0, KS0=ks0, T0=t0,
        NQ=nq, BNQ=bnq, BKQ=bkq, KSQ=ksq, T5=t5, BN1=bn1, BK1=bk1, KS1=ks1, BN2=bn2, BK2=bk2,
        KS2=ks2,
        POST=post, LAYERNORM=layernorm, NEXT=w_next is not None, GELU=gelu,
        NPROG=programs, T1=t1, T2=-(-N // bn2) * pieces, PIECES=pieces, num_warps=4)
    return buf["h2"], buf["x2"] if w_next is not None else None, qkv


def mega_half(step, lw, fz, h, att, w_next, cnt, next_fz=None):
    """The decode step's output projection and MLP half through `mlp_block` (MUSER_MEGA=mlp):
    (h', x') where it applies, None where the step's own launches must run -- more than 16
    rows, a parallel block, Gemma 4's layer scale, experts, int8 weights, an o bias, a gate|up
    or o tile with split-K pieces, or the older GEMV (MUSER_GEMV=fast).  `att`: the attention's
    rows [R, H * D].  `next_fz`: the next layer's fused weights -- its qkv projection comes
    last in the launch where it can (returned third; else None and the step runs it)."""
    from .weights_int8 import RowInt8
    spec = step.spec
    wgu, wd, wo = fz["wgu"], lw.w_down, lw.wo
    if (h.shape[0] > 16 or spec.parallel_block or not spec.pre_norm or lw.layer_scale is not None
            or lw.moe is not None or lw.bo is not None
            or any(isinstance(w, RowInt8) or w is None or not w.is_contiguous()
                   for w in (wgu, wd, wo))
            or any(k not in step.gemv_for for k in ("gu", "down", "o")) or step.batch1_only
            or dot_config(wd.shape[1], wd.shape[0], True)[4]
            or dot_config(wo.shape[0], wo.shape[1], False)[4]):
        return None
    wq = next_fz["wqkv"] if next_fz is not None else None
    if (wq is None or next_fz["bqkv"] is not None or isinstance(wq, RowInt8)
            or not wq.is_contiguous() or "qkv" not in step.gemv_for
            or dot_config(wq.shape[0], wq.shape[1], False)[4]):
        wq = None
    post = spec.sandwich_norm
    return mlp_block(h, None, lw.post_attn_norm if post else None, lw.pre_ffn_norm, wgu, wd,
                     lw.post_ffn_norm if post else None, w_next, spec.norm_eps, step.layernorm,
                     step.gelu, out={"cnt": cnt}, att=att.contiguous(), wo=wo, wqkv=wq)
