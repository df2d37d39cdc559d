"""Many planes in one step: a session's planes advanced, logged and written together.

Owns: `advance_lockstep` (planes that move as one: the arithmetic once), `read_evictions`
(the rows open checkpoints must log, copied out of every plane at once), `store_many` (a
chunk's rows into every plane of a session: checks, logs, bookkeeping, then the rows) and
`copy_rows` (the one multi-tensor copy they and a rollback's restores go through).  Does not
own: one plane's bookkeeping and rows (`plane.py`, its layouts in `ring.py` / `growing.py`:
these functions only call its methods), what a log keeps (`checkpoint.py`).

Why: a step of a 26-layer model touches 26 planes, and on CUDA each small copy is a launch
from Python (~5-10 us of host time).  A speculative round on the Gemma-3-1B shape (22 rings,
4 growing planes) made 44 copies to log evicted rows, 52 to write the block and 44 to restore:
~140 launches.  Batched, they are 3 multi-tensor copies plus the 8 into head-major growing
planes; the bits are the same copies'.

    store_many(planes, start, ks, vs):
        checks (every plane)  ->  evicted rows read (one copy)  ->  advance (every plane)
        ->  the chunk's rows written (one copy)
"""
from __future__ import annotations

import torch

from ..errors import CacheError
from .plane import Plane


def copy_rows(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    """dst[i].copy_(src[i]) for every pair; the pairs must not overlap.  Pairs of dense tensors
    of one dtype (ring rows, logs) go as one multi-tensor copy -- on CUDA a few launches for any
    number of them -- the rest (a growing plane's head-major views) one by one: torch takes its
    fast multi-tensor route only when every tensor of the call qualifies."""
    fast = [i for i, (d, s) in enumerate(zip(dst, src))
            if d.is_contiguous() and s.is_contiguous() and d.dtype == s.dtype]
    if len(fast) > 1:
        torch._foreach_copy_([dst[i] for i in fast], [src[i] for i in fast])
    else:
        fast = []
    done = set(fast)
    for i, (d, s) in enumerate(zip(dst, src)):
        if i not in done:
            d.copy_(s)


def read_evictions(planes: list[Plane], start: int, counts: list[int]
                   ) -> list[tuple[torch.Tensor, torch.Tensor] | None]:
    """For each plane with an open checkpoint, the live rows that `counts[i]` rows at `start`
    evict, copied out ([m, KV, D] keys and values; None where nothing is logged) -- before any
    of them is written over.  The checkpoint's checks run here first."""
    out, dst, src = [], [], []
    for p, n in zip(planes, counts):
        m = 0
        if p.undo is not None:
            lo, m = p.undo.evicted_range(p, start, n)
        if not m:
            out.append(None)
            continue
        k = p.keys.new_empty((m, p.kv_heads, p.head_dim))                  # [m, KV, D]
        v = torch.empty_like(k)
        for kd, vd, off, r in p.slot_views(p.slot(lo), m):
            dst += [k[off:off + r], v[off:off + r]]
            src += [kd, vd]
        out.append((k, v))
    copy_rows(dst, src)
    return out


def store_many(planes: list[Plane], start: int, keys: list[torch.Tensor],
               values: list[torch.Tensor], placed: list[bool] | None = None) -> None:
    """`plane.store(start, keys[i], values[i])` for every plane of one session, with the logs'
    reads and the rows' writes each one copy.  Every plane's checks run before anything moves.
    `placed[i]`: plane i (`writes_ahead`) holds these rows past its end already (a captured
    chunk pass wrote them there): its bookkeeping and log move, its rows are not copied again."""
    counts = []
    for i, (p, k, v) in enumerate(zip(planes, keys, values)):
        counts.append(p._check_rows(k, v, "store"))
        p._check_reservation(start, counts[-1])
        if placed is not None and placed[i] and not p.writes_ahead:
            raise CacheError(f"layer {p.layer}: a {p.kind} plane cannot hold rows past its end "
                             f"before they are committed (placed rows at {start})")
    evicted = read_evictions(planes, start, counts)
    dst, src = [], []
    for i, (p, k, v, n, ev) in enumerate(zip(planes, keys, values, counts, evicted)):
        first_slot, first_row = p.advance(n, (k, v), ev)
        if placed is not None and placed[i]:
            continue
        for kd, vd, off, r in p.slot_views(first_slot, n - first_row):
            a = first_row + off
            dst += [kd, vd]
            src += [k[a:a + r], v[a:a + r]]
    copy_rows(dst, src)


def advance_lockstep(planes: list[Plane], count: int) -> tuple[int, int]:
    """`Plane.advance(count)` for planes that move in lockstep -- one session's planes of one kind
    and capacity (its growing planes, or its rings of one capacity), equal in bookkeeping because
    every forward touches all of them and a failed one rolls all of them back.  Returns
    (first_slot, len after).  The arithmetic runs once, on planes[0], and the others `follow`
    it: a batched decode step of a 26-layer model at batch 16 would otherwise pay it 416 times
    on the host.  Under an open checkpoint each plane advances on its own (each logs its own
    evictions, read for all of them in one copy) and the results must agree."""
    lead = planes[0]
    if lead.undo is not None:
        evicted = read_evictions(planes, lead.end, [count] * len(planes))
        results = set()
        for p, ev in zip(planes, evicted):
            first_slot, _ = p.advance(count, evicted=ev)
            results.add((first_slot, p.len))
        if len(results) != 1:
            raise CacheError(f"planes moving in lockstep disagree at position {lead.end - count}: "
                             f"{sorted(results)}")
        return results.pop()
    before = lead.bookmark()
    first_slot, _ = lead.advance(count)
    Plane.follow(planes[1:], before, lead.bookmark())
    return first_slot, lead.len
