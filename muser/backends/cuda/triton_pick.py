"""The greedy pick of a step's logits in one launch (Triton): what `greedy_rows` computes.

Owns: `pick_rows(logits, res, ws)` -- each row's first maximum with NaN read as -inf and +inf as
the largest float32, and whether the row had anything but NaN and -inf, written to res [2, B]
int64 (token | ok); and its workspace (`PickWorkspace`).  The pipelined greedy graph
(cuda/greedy.py) ends in it: torch's route (nan_to_num, max, compare, stack, copy) is five or
six launches at ~2.5 us each on the step's critical path.  Does not own: what a greedy pick
means (backends/greedy.py: `greedy_rows`, the reference this is tested against).

`pick_partials(vals, idx, res)`: the same answer from a picking head (`dot_rows(pick=True)`:
each output tile's first maximum a row, the logits never stored), folded in tile order -- the
pipelined greedy step's tail when the head is dot_rows and the logits are the head's values
(DecodeStep.fused_pick): 16 rows x 262,144 float32 logits are neither written nor read again.

How: a row's columns are cut into NB chunks, one program each; a program folds its chunk in
BLOCK-wide pieces (each piece's max and first index of it, kept when strictly greater: the
first maximum), stores (value, index), takes a ticket, and the row's last program folds the NB
partials in chunk order (the first partial holding the maximum holds its first index).  Only
comparisons: the same token as torch's `max(-1)` whatever order the programs ran in.
"""
from __future__ import annotations

import functools

import torch

from .triton_pieces import pdl_launch, pdl_pieces

CHUNK = 8192                                   # columns a program folds
BLOCK = 1024                                   # columns a program loads at once


class PickWorkspace:
    """Partials [B, NB] (value float32, index int64) and per-row tickets [B] int32, zero between
    calls (the last program resets its row's)."""

    def __init__(self, batch: int, vocab: int, device):
        self.nb = -(-vocab // CHUNK)
        self.vals = torch.empty((batch, self.nb), dtype=torch.float32, device=device)
        self.idx = torch.empty((batch, self.nb), dtype=torch.int64, device=device)
        self.cnt = torch.zeros(batch, dtype=torch.int32, device=device)


@functools.lru_cache(maxsize=None)
def pick_pieces() -> dict:
    """`_pick_key(x, BIG)`: the value a greedy pick compares -- NaN as -inf, +inf as BIG (the
    largest float32) -- for every kernel that picks (pick_kernel here, a picking dot_rows'
    epilogue): one key, so both name the same token."""
    import triton
    import triton.language as tl

    globals()["tl"] = tl                # the interpreter looks for the language in module globals

    @triton.jit
    def pick_key(x, BIG: tl.constexpr):
        x = tl.where(x != x, float("-inf"), x)
        return tl.where(x == float("inf"), BIG, x)

    return {"_pick_key": pick_key}


@functools.lru_cache(maxsize=None)
def _kernel():
    import triton
    import triton.language as tl

    globals()["tl"] = tl                # the interpreter looks for the language in module globals
    globals().update(pdl_pieces())
    globals().update(pick_pieces())

    @triton.jit
    def pick_kernel(L, VALS, IDX, CNT, RES, NCOL, B, NB, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
                    NBP: tl.constexpr, BIG: tl.constexpr, PDL: tl.constexpr):
        _pdl_begin(PDL)                     # PDL: wait for the kernel before, first
        nb = tl.program_id(0)
        b = tl.program_id(1)
        best_v = float("-inf")
        best_i = (nb * CHUNK).to(tl.int64)
        for c0 in range(0, CHUNK, BLOCK):
            cols = nb * CHUNK + c0 + tl.arange(0, BLOCK)
            x = tl.load(L + b.to(tl.int64) * NCOL + cols, mask=cols < NCOL, other=float("-inf"))
            x = _pick_key(x, BIG)                                  # NaN -inf, +inf BIG
            v = tl.max(x, 0)
            i = tl.argmax(x, 0, tie_break_left=True)
            take = v > best_v                                      # strictly: the first maximum
            best_i = tl.where(take, (nb * CHUNK + c0 + i).to(tl.int64), best_i)
            best_v = tl.where(take, v, best_v)
        tl.store(VALS + b * NB + nb, best_v)
        tl.store(IDX + b * NB + nb, best_i)
        tl.debug_barrier()
        ticket = tl.atomic_add(CNT + b, 1, sem="acq_rel", scope="gpu")
        if ticket == NB - 1:                                       # the row's last program
            j = tl.arange(0, NBP)
            vals = tl.load(VALS + b * NB + j, mask=j < NB, other=float("-inf"))
            idx = tl.load(IDX + b * NB + j, mask=j < NB, other=0)
            top = tl.max(vals, 0)
            first = tl.argmax(vals, 0, tie_break_left=True)        # chunks in column order
            tok = tl.sum(tl.where(j == first, idx, 0), 0)
            tl.store(RES + b, tok)
            tl.store(RES + B + b, (top > float("-inf")).to(tl.int64))
            tl.store(CNT + b, 0)

    @triton.jit
    def fold_kernel(VALS, IDX, RES, B, NB, BLOCK: tl.constexpr, PDL: tl.constexpr):
        """One row's partials [NB] (a picking dot_rows' tiles, in column order) -> its token
        and ok flag: the first partial holding the maximum holds the row's first maximum."""
        _pdl_begin(PDL)
        b = tl.program_id(0)
        best_v = float("-inf")
        best_i = tl.load(IDX + b.to(tl.int64) * NB)
        for c0 in range(0, NB, BLOCK):
            j = c0 + tl.arange(0, BLOCK)
            v = tl.load(VALS + b.to(tl.int64) * NB + j, mask=j < NB, other=float("-inf"))
            top = tl.max(v, 0)
            take = top > best_v                                    # strictly: the first one
            at = c0 + tl.argmax(v, 0, tie_break_left=True)
            i = tl.load(IDX + b.to(tl.int64) * NB + at, mask=take, other=0)
            best_i = tl.where(take, i, best_i)
            best_v = tl.where(take, top, best_v)
        tl.store(RES + b, best_i)
        tl.store(RES + B + b, (best_v > float("-inf")).to(tl.int64))

    return pick_kernel, fold_kernel


def pick_rows(logits: torch.Tensor, res: torch.Tensor, ws: PickWorkspace,
              pdl: bool = False) -> torch.Tensor:
    """float32 logits [B, V] -> res [2, B] int64: each row's greedy token and whether it had a
    logit to choose (`greedy_rows`, in one launch).  Graph-capturable."""
    import triton
    B, V = logits.shape
    logits = logits.contiguous()
    kern = _kernel()[0]
    kern[(ws.nb, B)](logits, ws.vals, ws.idx, ws.cnt, res, V, B, ws.nb, CHUNK=CHUNK, BLOCK=BLOCK,
                     NBP=triton.next_power_of_2(ws.nb), BIG=torch.finfo(torch.float32).max,
                     num_warps=4, **pdl_launch(pdl))
    return res


def pick_partials(vals: torch.Tensor, idx: torch.Tensor, res: torch.Tensor,
                  pdl: bool = False) -> torch.Tensor:
    """A picking dot_rows' partials (vals float32, idx int64, each [B, tiles]) -> res [2, B]
    int64, what `pick_rows` writes for the logits those tiles cover (one program a row).
    Graph-capturable."""
    B, nb = vals.shape
    if idx.shape != (B, nb) or vals.dtype != torch.float32 or idx.dtype != torch.int64 \
            or res.shape != (2, B):
        raise ValueError(f"pick_partials needs float32 / int64 partials [B, tiles] and res "
                         f"[2, B], got {vals.dtype} {tuple(vals.shape)}, {idx.dtype} "
                         f"{tuple(idx.shape)}, res {tuple(res.shape)}")
    _kernel()[1][(B,)](vals, idx, res, B, nb, BLOCK=1024, num_warps=4, **pdl_launch(pdl))
    return res
