"""Weights pulled into the L2 while a decode step's attention leaves the memory bus idle.

Owns: `prefetch_pieces()` -- `_prefetch_l2`, the Triton piece a launch calls to have the
copy engine bring byte ranges into the L2 (`cp.async.bulk.prefetch.L2`: one instruction a
chunk, nothing comes back to the SM) -- and `Prefetch` / `plan` / `plans` / `step_plans`,
the host side: which weights the attention launch asks for, in how many programs.  Does not
own: the launch that runs the piece (triton_decode_kernel.py: the attention's extra grid row,
through `_pdl_prefetch_begin`, after the PDL wait) or where the step passes it (decode_step.py).

Why the attention: a decode layer is, on the 1B (H200, bf16, 2k),

    qkv dot 3.5 MB | attention ~10 us, ~17 busy SMs, KB of K/V | o 2.4 MB | gate|up 32 MB | down 16 MB
                     ^^^^^^^^^^ the bus idles here

so the bytes of o, gate|up and down can start their trip while the attention runs, and their
launches then read the L2.  (The ninth session's prefetch ran in every dot_rows program,
competing with the projection before it for the same bus, and lost; this one uses programs of
an otherwise idle launch.)  A prefetch moves no value: the bits of every row are the launch's
own -- only where the bytes come from changes.  (Measured and removed, benchmarks/NOTES.md,
thirty-fourth / thirty-sixth sessions: the add+norms between the projections asking too, for
the next layer's qkv or more of o | gate|up | down -- 1B QKV -2 us, MLP +45 us, both +36 us; an
L2 evict_last policy -- 16 MB +21 us; 128 programs instead of 32 -- 32 MB +28 us; asking before
the PDL wait -- the same on the 1B / 270M, +90 us on the 4B.)

Ranges are joined end to end and cut into `programs x lanes` chunks; lane i of program s
takes chunk s * lanes + i:

    ranges   |------ o ------|------------ gate|up ------------|---- down ----|
    chunks   |c0 |c1 |c2 |c3 |c4 |c5 |  ...                               |cN |   (budget: the
                                                                                  first B bytes)

A chunk that straddles two ranges stops at the first one's end: the next range's first bytes
up to that chunk's end are not asked for (less than a chunk a boundary, a few KB).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

CHUNK_ALIGN = 16             # the bulk copy's size and address unit (bytes)
RANGES = 3                   # ranges a launch can take (o, gate|up, down)
PROGRAMS = 32                # programs of the attention's prefetch row (128 lost: 32 MB +28 us)


@dataclass(frozen=True)
class Prefetch:
    """What one launch prefetches: RANGES (address, bytes) pairs (bytes 0: unused), the chunk
    each lane takes (bytes) and the programs (they ask after the launch's PDL wait)."""
    ranges: tuple[tuple[int, int], ...]
    chunk: int
    programs: int
    lanes: int = 128             # lanes a program: its threads (32 x the launch's warps)

    def args(self) -> list[int]:
        """The launch's runtime arguments: addr0, n0, addr1, n1, addr2, n2, chunk."""
        return [v for r in self.ranges for v in r] + [self.chunk]

    def consts(self) -> dict:
        """The launch's constexprs (a kernel taking a prefetch row names them so)."""
        return dict(NPF=self.programs, PF_LANES=self.lanes)


def launch_args(pf: Prefetch | None) -> tuple[list[int], dict]:
    """(runtime args, constexprs) of a launch that may run a prefetch row: without one, zeros
    and no constexprs (the kernel's defaults: NPF 0, the row compiled out)."""
    return (pf.args(), pf.consts()) if pf is not None else ([0] * (2 * RANGES + 1), {})


def _span(t: torch.Tensor) -> tuple[int, int]:
    if not t.is_contiguous():
        raise ValueError(f"a prefetch range must be contiguous; found strides {t.stride()}")
    return t.data_ptr(), t.numel() * t.element_size()


def plan(tensors: list[torch.Tensor], budget: int, programs: int, lanes: int) -> Prefetch | None:
    """The first `budget` bytes of `tensors` (in order; at most RANGES) as chunks of
    `programs x lanes` lanes.  Every address and size is a multiple of CHUNK_ALIGN (a tensor's
    start is 16-byte aligned in torch's allocator; a size that is not is cut down to one)."""
    if budget <= 0 or not tensors:
        return None
    if len(tensors) > RANGES:
        raise ValueError(f"at most {RANGES} prefetch ranges; found {len(tensors)}")
    ranges, left = [], budget
    for t in tensors:
        addr, n = _span(t)
        if addr % CHUNK_ALIGN:
            raise ValueError(f"a prefetch range must start {CHUNK_ALIGN}-byte aligned; found {addr:#x}")
        n = min(n, left) // CHUNK_ALIGN * CHUNK_ALIGN
        ranges.append((addr, n))
        left -= n
    ranges += [(0, 0)] * (RANGES - len(ranges))
    total = sum(n for _, n in ranges)
    if total == 0:
        return None
    lanes_all = programs * lanes
    chunk = -(-total // lanes_all)
    chunk = -(-chunk // CHUNK_ALIGN) * CHUNK_ALIGN
    return Prefetch(tuple(ranges), chunk, programs, lanes)


def _plain(tensors) -> bool:
    """Whether `tensors` are all contiguous plain tensors (not int8 rows, experts, None)."""
    return tensors is not None and all(isinstance(t, torch.Tensor) and t.is_contiguous()
                                       for t in tensors)


def plans(ranges: list, mb: int, lanes: list[int]) -> list[Prefetch | None]:
    """One Prefetch per layer: layer i asks for the first `mb` MB of ranges[i] (tensors; None, or
    any that is not one contiguous plain tensor -- int8 rows, experts, a missing projection --
    asks for nothing) with PROGRAMS programs of lanes[i] lanes."""
    return [plan(ts, mb << 20, PROGRAMS, n) if _plain(ts) else None
            for ts, n in zip(ranges, lanes)]


def step_plans(layers, fused: list[dict], lays: list[dict], env) -> list[Prefetch | None]:
    """A decode step's prefetches per layer, from its Env: the attention launch's -- the first
    MB of o | gate|up | down, MUSER_PREFETCH.  `layers`: the weights' layers (wo, w_down, moe),
    `fused`: their fused wgu, `lays`: the attention layouts (warps: the attention's lanes).  An
    MoE layer asks for nothing."""
    mlp = [None if lw.moe is not None else [lw.wo, fz["wgu"], lw.w_down]
           for lw, fz in zip(layers, fused)]
    mb = 0 if env.prefetch == "off" else 8 if env.prefetch == "auto" else int(env.prefetch)
    return plans(mlp, mb, [32 * lay["warps"] for lay in lays]) if mb else [None] * len(layers)


@functools.lru_cache(maxsize=None)
def prefetch_pieces() -> dict:
    """`_prefetch_l2(P0, N0, P1, N1, P2, N2, CH, s, LANES)`: program s's lanes each ask the
    copy engine for one chunk of the joined ranges (a lane past the end asks for nothing)."""
    import triton
    import triton.language as tl

    globals()["tl"] = tl

    @triton.jit
    def bulk_prefetch(addr, size):
        """Each lane asks the copy engine for `size` bytes at `addr` (int64; both 16-byte
        multiples; size <= 0: nothing).  The asm's output is a dummy (is_pure=False keeps it)."""
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.gt.s32 p, $2, 0; "
            "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.b32 $0, 0; }",
            "=r,l,r", [addr, size], dtype=tl.int32, is_pure=False, pack=1)

    globals()["_bulk_prefetch"] = bulk_prefetch

    @triton.jit
    def prefetch_l2(P0, N0, P1, N1, P2, N2, CH, s, LANES: tl.constexpr):
        off = (s * LANES + tl.arange(0, LANES)).to(tl.int64) * CH     # bytes into the joined ranges
        n0 = N0.to(tl.int64)
        e1 = n0 + N1.to(tl.int64)
        e2 = e1 + N2.to(tl.int64)
        addr = tl.where(off < n0, P0 + off, tl.where(off < e1, P1 + (off - n0), P2 + (off - e1)))
        end = tl.where(off < n0, n0, tl.where(off < e1, e1, e2))
        size = tl.minimum(tl.maximum(end - off, 0), CH).to(tl.int32)
        _bulk_prefetch(addr, size)           # the copy engine moves the bytes

    return {"_prefetch_l2": prefetch_l2}
