"""Chunk attention on CUDA with a decode step's arithmetic (Triton).

Owns: `chunk_attention(q, keys, values, ...)` -- the queries of one session's
chunk (a prefill chunk, a verification block) over a staged key view, each
row reduced exactly as the decode step reduces it (triton_attn.py: the same
absolute splits, tiles and merge order), so a row's output does not depend on
the chunk it came in.  Does not own: staging (muser.cache.staging decides what
the view holds and when the chunk's rows land), q/k/v preparation
(triton_decode.prepare_rows), the reduction shape (triton_attn.layout), which
launch shape and loop a chunk takes (chunk_route.py), the kernel's code
(triton_chunk_kernel.py).

The program's walk -- a tile of query slots over its rows' splits, folded in the
decode step's order, keys read by position -- is triton_chunk_kernel.py's; here,
the forms the call picks.

With MUSER_CHUNK_FIRST=on a flat loop whose splits are one tile each (a ring's) starts every
split with `tile_first` (triton_attn.py: no state to reset or rescale; the same bits).
`chunk_loop="flat"` (MUSER_CHUNK_LOOP) runs the same sequence as one loop over
the tiles with the boundaries inside it, which the compiler can
software-pipeline (a ring split is one tile): the default on rings (H200, a
sliding layer's 16k prefill 0.81 -> 0.62 ms), on growing splits of one tile
(MUSER_GROWING_ROWS=32: a global layer's 6.8 -> 5.4 ms) and on aligned growing
runs (loop "aligned": no selects, a split reset where it ends; 5.65 -> 5.38 ms at
128-key splits), not on other growing chunks (8.0 against 10.7 ms with the selects).
`dsplit` (MUSER_CHUNK_COLUMNS) gives each of 1, 2 or 4 programs a slice of the value
columns -- no spills, more score work: slower.
"""
from __future__ import annotations

import torch

from .chunk_route import CHUNK_ROWS, chunk_route
from .triton_chunk_kernel import _kernel
from .triton_chunk_park import fold_parked, park_workspace
from .triton_pieces import _pow2


def chunk_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int,
                    first: int, window: int | None, scale: float, softcap: float | None,
                    interleaved: bool, lay: dict, sinks: torch.Tensor | None = None,
                    ring: tuple[int, int] | None = None, block_m: int = CHUNK_ROWS,
                    out: torch.Tensor | None = None, warps: int | None = None,
                    stages: int | None = None, dsplit: int | None = None,
                    new: tuple[torch.Tensor, torch.Tensor] | None = None,
                    kcount: int | None = None,
                    dev: tuple[torch.Tensor, torch.Tensor] | None = None,
                    positions: int | None = None) -> torch.Tensor:
    """q [R, H, D] at positions start.. over keys/values [S, KV, D] -> [R, H, D].

    Key position x is row x - first of the view, or with `ring` = (rot, capacity) row
    (rot + x - first) mod capacity (a ring read in place).  Row i sees positions
    [max(p - window + 1, 0), p], p = start + i (`window` None: [0, p]).  `lay` is the layer's
    triton_attn.layout -- the decode step's, or the bits differ.  `interleaved`: the model's
    RoPE pairing, which fixes the column order the decode kernel reduces head dims in.
    `new` = (k, v) [R, KV, D] contiguous: positions from `start` on are read there (row
    x - start) and the view holds only the history (`kcount` rows of it; ring: all capacity
    slots).  `dev` = (TAB int64 [4], META int64 [6]): the view's pointers / strides and
    (start, R, first, rot, capacity, kcount) read on the device instead of from these args
    (a captured pass, chunk_graph.py; the args' values are then ignored, `ring` still says
    whether the view wraps).  Chunks of up to `lay["park"]` rows spread their splits over
    programs and fold them in a second launch (triton_chunk_park.py: the same bits); with
    `dev` that needs `positions`, a bound on every position the pass can hold."""
    R, H, D = q.shape
    KV = keys.shape[1]
    G = H // KV
    if keys.stride() != values.stride() or keys.stride(-1) != 1:
        raise ValueError(f"keys/values views must share strides with unit last stride, "
                         f"got {tuple(keys.stride())} and {tuple(values.stride())}")
    q = q.contiguous()
    out = out if out is not None else torch.empty_like(q)
    if R == 0:
        return out
    half = D // 2
    rt = chunk_route(R, G, D, start, lay, ring=ring is not None, window=window,
                     dev=dev is not None, positions=positions,
                     block_m=block_m, warps=warps, dsplit=dsplit)
    # past PARK_BYTES of partials a parked tile runs unparked (its launch shape kept)
    ws = park_workspace(q.device, rt.tiles * KV * rt.nsp * rt.bm, 2 * _pow2(half, 8)) \
        if rt.park else None
    rot, capm = ring if ring is not None else (0, 0)
    new_k, new_v = new if new is not None else (keys, values)
    spare = ws if ws is not None else (q, q, q)
    whole = rt.whole and new is None and ring is None     # whole tiles read an ordered view
    _kernel()[(rt.tiles, KV, rt.nsp if ws is not None else rt.dsplit)](
        q, keys, values, out, sinks if sinks is not None else q, new_k, new_v,
        dev[0] if dev is not None else q, dev[1] if dev is not None else q, *spare,
        int(start), R, int(first), int(rot), int(capm),
        int(kcount if kcount is not None else keys.shape[0]),
        keys.stride(0), keys.stride(1), int(window or 0), float(scale), float(softcap or 1.0),
        rt.nsp,
        H=H, KV=KV, G=G, D=D, HALF=half, BLOCK_H=_pow2(half, 8), INTERLEAVED=bool(interleaved),
        BM=rt.bm, ROWS=rt.rows, BLOCK_N=lay["block_n"], SPLIT=lay["split"],
        GS=lay["group"], SOFTCAP=softcap is not None, SINKS=sinks is not None,
        RING=ring is not None, FLAT=rt.flat, DSPLIT=rt.dsplit,
        INTERIOR=bool(lay.get("interior", True)), ACC_DOT=bool(lay.get("acc_dot", False)),
        TWO=new is not None, DEV=dev is not None, ONE=rt.one, PARK=ws is not None,
        FLATTEN=lay.get("flatten") in ("chunk", "on"), ALIGN=rt.align, LIVE=rt.live,
        HEAVY=rt.heavy, HINTS=dev is not None and new is None, num_warps=rt.warps,
        # (the move is PTX: left out -- a bit copy -- under Triton's interpreter and on ROCm)
        **({"FENCE": True} if rt.fence and q.is_cuda and torch.version.hip is None else {}),
        **({"WHOLE": True} if whole else {}), **({"BASE": True} if whole and rt.base else {}),
        enable_fp_fusion=False,
        **({"num_stages": stages} if stages else {}))
    if ws is not None:
        fold_parked(out, KV, sinks, dev[1] if dev is not None else None, ws, start, R, window,
                    rt.nsp, rt.tiles, rt.rows, rt.bm, interleaved, lay, rt.warps)
    return out
