"""A chunk row gets a decode step's bits (triton_chunk against triton_decode, torch.equal):
positions decoded one at a time through the fused decode launch, and the same positions in
chunks of many sizes through prepare_rows + stage + chunk_attention -- on a ring through its
wrap (every staging route: in place, shadow, ring decode) and on a growing plane across
many splits and merge groups; and both against the plain-torch reference."""
import pytest
import torch

from muser.attention.reference import attention as reference
from muser.attention.reference import visibility_mask
from muser.cache import GrowingPlane, RingPlane, stage
from muser.cache.many import advance_lockstep
from muser.model import ops

from cudautil import HAS_CUDA, needs_kernels, rel

pytestmark = needs_kernels

N = 150                       # positions: past a ring of 48 three times
D = "decode"                  # a chunk's rows prepared by the decode launch itself


def _plane(kind, kv, d, dtype, dev):
    return (RingPlane(0, 48, 512, kv, d, dtype, dev) if kind == "ring"
            else GrowingPlane(0, 512, kv, d, dtype, dev))


def _layout(kind, d, block_n, group=None, depth=1, loop="nested", dsplit=1, tiles=2, first=False,
            park=16, prep="decode", flatten="off"):
    from muser.backends.cuda.triton_attn import layout
    lay = layout(kind == "growing", d)
    # small splits and groups: many of each in 150 positions (two-level merges included; a
    # ring's row starts anywhere, so its first and last groups are partly outside it)
    group = group or (2 if kind == "growing" else lay["group"])
    return {**lay, "block_n": block_n, "split": tiles * block_n, "group": group, "depth": depth,
            "chunk_loop": loop, "dsplit": dsplit, "first_tile": first, "park": park, "prep": prep,
            "flatten": flatten}


def _inputs(heads, kv, d, dtype, dev, qk_norm, seed=0):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(N, (heads + 2 * kv) * d, generator=g).to(dev, dtype)
    qn = (torch.rand(d, generator=g) + 0.5).to(dev) if qk_norm else None
    kn = (torch.rand(d, generator=g) + 0.5).to(dev) if qk_norm else None
    cos, sin = ops.rope_tables(10000.0, 1.0, d, dev, 1024)
    return qkv, qn, kn, cos, sin


def _decode(kind, heads, kv, d, dtype, dev, lay, qkv, qn, kn, cos, sin, scale, softcap):
    from muser.backends.cuda.triton_decode import fused_decode_attention, plane_row, splits_for
    plane = _plane(kind, kv, d, dtype, dev)
    cap = plane.capacity if kind == "ring" else 0
    nsplit = splits_for(plane.capacity, kind == "growing", lay["split"])
    outs = []
    for p in range(N):
        slot, n = advance_lockstep([plane], 1)
        table = torch.tensor([plane_row(plane)], dtype=torch.int64, device=dev)
        meta = torch.tensor([[slot, n]], dtype=torch.int64, device=dev)
        pos = torch.tensor([p], dtype=torch.int64, device=dev)
        outs.append(fused_decode_attention(qkv[p:p + 1], pos, cos, sin, qn, kn, 1e-6, table, meta,
                                           heads, kv, d, nsplit, scale, softcap, False,
                                           capacity=cap, **lay))
    return torch.cat(outs), plane, nsplit, cap


def _chunks(kind, sizes, heads, kv, d, dtype, dev, lay, nsplit, cap, qkv, qn, kn, cos, sin, scale,
            softcap, block_m, warps=None):
    from muser.backends.cuda.triton_chunk import chunk_attention
    from muser.backends.cuda.triton_decode import prepare_rows
    plane = _plane(kind, kv, d, dtype, dev)
    outs, at, routes = [], 0, set()
    for c in sizes:
        pos = torch.arange(at, at + c, device=dev)
        q, k, v = prepare_rows(qkv[at:at + c], pos, cos, sin, qn, kn, 1e-6, heads, kv, d, nsplit,
                               False, capacity=cap, **lay)
        st = stage(plane, at, k, v)
        ring = None if st.ordered else (plane.origin_physical, plane.capacity)
        routes.add("ring decode" if ring else ("shadow" if st._new is not None else "in place"))
        outs.append(chunk_attention(q, st.keys, st.values, at, st.first_position, plane.window,
                                    scale, softcap, False, lay, ring=ring, block_m=block_m,
                                    warps=warps))
        st.commit()
        at += c
    return torch.cat(outs), plane, routes


SPLITS = [[N], [1, 7, 97, 45], [50, 1, 1, 98], [16] * 9 + [6]]


@pytest.mark.parametrize("kind,group,depth,loop,dsplit,tiles,first,park,prep", [
    ("ring", None, 1, "nested", 1, 2, False, 16, D), ("ring", 3, 4, "flat", 2, 2, False, 16, D),
    ("ring", None, 4, "flat", 1, 1, True, 16, D), ("ring", None, 4, "flat", 1, 1, True, 0, D),
    ("ring", None, 4, "flat", 1, 1, True, 16, "alone"),
    ("growing", None, 1, "nested", 2, 2, False, 16, D), ("growing", None, 4, "flat", 1, 2, False, 16, D),
    ("growing", None, 1, "nested", 4, 2, False, 16, D), ("growing", None, 1, "nested", 1, 2, False, 0, D),
    ("growing", None, 1, "nested", 1, 2, False, 0, "alone"),
    ("growing", None, 1, "flatten", 1, 2, False, 0, D),
    ("growing", None, 4, "flatten", 1, 3, False, 16, D)])
@pytest.mark.parametrize("heads,kv,d,qk_norm,softcap", [(4, 2, 32, True, None), (4, 1, 64, False, 5.0)])
def test_a_chunk_row_has_the_decode_bits(dev, kdtype, kind, group, depth, loop, dsplit, tiles, first,
                                         park, prep, heads, kv, d, qk_norm, softcap):
    """(depth: the decode merges load 1 or 4 parked partials at once; loop: the chunk kernel's
    loop structure ("flatten": the nested loop on fixed tile bounds, fused by Triton); dsplit: value-column slices per query tile; first: one-tile splits started
    by tile_first; park: chunks of up to that many rows (here [1, 7, 1, 1, 16, 6]) run one split
    a program and fold the parked partials after; prep: the chunk's q/k/v prepared by the decode
    launch itself or by its prologue compiled alone -- speed choices, the same bits)"""
    if dsplit > 1 and not HAS_CUDA:
        pytest.skip("numpy's matmul (the interpreter's dot) sums a column by the matrix's width")
    scale = d ** -0.5
    flatten = "chunk" if loop == "flatten" else "off"      # the nested loop, fused by Triton
    lay = _layout(kind, d, 16, group, depth, "nested" if flatten == "chunk" else loop, dsplit,
                  tiles, first, park, prep, flatten)
    ins = _inputs(heads, kv, d, kdtype, dev, qk_norm)
    ref_out, ref_plane, nsplit, cap = _decode(kind, heads, kv, d, kdtype, dev, lay, *ins, scale, softcap)
    assert not ref_out.isnan().any()
    # on the GPU a chunk packs 64 query slots (16 rows) per tile; the interpreter's dot is
    # numpy's, whose bits follow where a row sits in the matrix, so there a tile holds one
    # row in the decode step's slots
    block_m = 64 if HAS_CUDA else heads // kv
    seen = set()
    for sizes in SPLITS:
        out, plane, routes = _chunks(kind, sizes, heads, kv, d, kdtype, dev, lay, nsplit, cap, *ins,
                                     scale, softcap, block_m)
        seen |= routes
        assert torch.equal(out, ref_out), (sizes, (out.float() - ref_out.float()).abs().max())
        ka, va = plane.logical_rows()
        kb, vb = ref_plane.logical_rows()
        assert torch.equal(ka, kb) and torch.equal(va, vb)
    if kind == "ring":
        assert seen == {"in place", "shadow", "ring decode"}
    # and the values are attention's: against the reference over the whole history
    qkv, qn, kn, cos, sin = ins
    q = qkv[:, :heads * d].view(N, heads, d)
    k = qkv[:, heads * d:(heads + kv) * d].view(N, kv, d)
    spec = type("S", (), {"norm": "rms", "norm_eps": 1e-6})()
    if qn is not None:
        q, k = ops.norm(q, qn, spec), ops.norm(k, kn, spec)
    pos = torch.arange(N, device=dev)
    q = ops.apply_rope(q, cos[pos], sin[pos], False)
    k = ops.apply_rope(k, cos[pos], sin[pos], False)
    v = qkv[:, (heads + kv) * d:].view(N, kv, d)
    mask = visibility_mask(pos, pos, 48 if kind == "ring" else None)
    want = reference(q.float(), k.float(), v.float(), mask, scale, softcap)
    assert rel(ref_out, want) < 2e-2


@pytest.mark.interp       # the one chunk row CI runs (~25 s interpreted; the rest ~45 s each)
def test_sinks_give_a_chunk_row_the_decode_bits(dev, kdtype):
    from muser.backends.cuda.triton_chunk import chunk_attention
    from muser.backends.cuda.triton_decode import decode_attention, plane_row, splits_for
    heads, kv, d = 4, 2, 32
    lay = _layout("ring", d, 16)
    g = torch.Generator().manual_seed(3)
    sinks = torch.tensor([-1.0, 0.5, 2.0, 6.0], device=dev)
    plane = _plane("ring", kv, d, kdtype, dev)
    k = torch.randn(100, kv, d, generator=g).to(dev, kdtype)
    v = torch.randn(100, kv, d, generator=g).to(dev, kdtype)
    q = torch.randn(100, heads, d, generator=g).to(dev, kdtype)
    nsplit = splits_for(48, False, lay["split"])
    want = []
    for p in range(100):                              # decode: store, then attend in place
        slot, n = advance_lockstep([plane], 1)
        plane.write_slots(slot, k[p:p + 1], v[p:p + 1])
        want.append(decode_attention(q[p:p + 1], torch.tensor([p], device=dev),
                                     torch.tensor([plane_row(plane)], device=dev),
                                     torch.tensor([[slot, n]], device=dev), kv, nsplit, 0.2, None,
                                     sinks=sinks, capacity=48, **lay))
    block_m = 64 if HAS_CUDA else heads // kv
    got = chunk_attention(q, k, v, 0, 0, 48, 0.2, None, False, lay, sinks=sinks, block_m=block_m)
    assert torch.equal(got, torch.cat(want))
    # chunks of up to lay["park"] rows: one split a program, the sinks joined by the fold
    parts = [chunk_attention(q[a:a + 16], k, v, a, 0, 48, 0.2, None, False, lay, sinks=sinks,
                             block_m=block_m) for a in range(0, 100, 16)]
    assert lay["park"] >= 16 and torch.equal(torch.cat(parts), torch.cat(want))


@pytest.mark.parametrize("align,sizes,loop,heavy", [
    ("tiles", [1, 7, 97, 45], "nested", False), (True, [50, 1, 1, 98], "nested", False),
    (True, [1, 7, 97, 45], "nested", True), (True, [50, 1, 1, 98], "flat", False),
    (True, [1, 7, 97, 45], "flat", True)])
def test_aligned_row_runs_without_the_selects_have_the_decode_bits(dev, kdtype, align, sizes, loop,
                                                                   heavy):
    """lay["align"] (MUSER_CHUNK_ALIGN): a growing plane's programs take ROWS-aligned runs of
    positions, so every row sees a key of every tile and split its program walks: tile_step's
    state-keeping select is left out ("tiles"), and merge_one's too (True: merge_live from a
    -0.0 empty state) -- still the decode step's bits, chunks starting anywhere.  (Under the
    interpreter the selects only ever matter for zero signs; the GPU rows are the real check.)
    loop "flat": the flat loop's aligned tile step, which resets a split where it ends; heavy:
    the last query tiles start first (MUSER_CHUNK_ORDER, a launch order only)."""
    heads, kv, d = 4, 2, 32
    lay = _layout("growing", d, 16, loop=loop)
    ins = _inputs(heads, kv, d, kdtype, dev, True)
    ref, _, nsplit, cap = _decode("growing", heads, kv, d, kdtype, dev, lay, *ins, d ** -0.5, None)
    out, _, _ = _chunks("growing", sizes, heads, kv, d, kdtype, dev,
                        {**lay, "align": align, "heavy": heavy},
                        nsplit, cap, *ins, d ** -0.5, None, 32)
    assert torch.equal(out, ref)


@pytest.mark.parametrize("knobs", [dict(fence=True, whole=False, base=False),
                                   dict(fence=False, whole=True, base=False),
                                   dict(fence=True, whole=True, base=False),
                                   dict(fence=True, whole=True, base=True)],
                         ids=["fence", "whole", "both", "based"])
@pytest.mark.parametrize("tiles,sizes,heads", [(2, [1, 7, 97, 45], 4), (4, [50, 1, 1, 98], 4),
                                               (1, [N], 8), (2, [16] * 9 + [6], 4)])
def test_the_flat_loop_s_fence_and_whole_tiles_have_the_decode_bits(dev, kdtype, knobs, tiles,
                                                                    sizes, heads):
    """The flat aligned loop's three launch choices, alone and together (all three: the
    default): lay["fence"]
    (MUSER_CHUNK_FENCE) copies p @ V's result through an opaque move before the split-end branch,
    so the wgmma is waited for there; lay["whole"] (MUSER_CHUNK_WHOLE) loads the key tiles every
    row sees whole without row masks (eager chunks over the plane: the ordered view's route);
    lay["base"] (MUSER_CHUNK_BASE) addresses those tiles from one base a program ("based": the
    default since the thirty-second session; each row names all three, so a default that moves
    does not move a row's route).
    The decode step's bits: splits of one, two and four tiles, chunks of every size starting
    anywhere.  (The fence on the GPU only: the interpreter has no inline asm, so there the route
    runs without the move.)"""
    from muser.backends.cuda.chunk_route import chunk_route
    kv, d = 2, 32
    lay = {**_layout("growing", d, 16, loop="aligned", tiles=tiles), "align": True, **knobs}
    rt = chunk_route(97, heads // kv, d, 1, lay, ring=False, window=None, dev=False, block_m=32)
    assert (rt.fence, rt.whole, rt.base) == (knobs["fence"], knobs["whole"], knobs["base"])
    ins = _inputs(heads, kv, d, kdtype, dev, True)
    ref, _, nsplit, cap = _decode("growing", heads, kv, d, kdtype, dev, lay, *ins, d ** -0.5, None)
    out, _, _ = _chunks("growing", sizes, heads, kv, d, kdtype, dev, lay, nsplit, cap, *ins,
                        d ** -0.5, None, 32)
    assert torch.equal(out, ref)


@pytest.mark.parametrize("kind,heads,kv,loop,shape", [
    ("growing", 4, 1, "aligned", (128, 2, 8, True)), ("growing", 4, 1, "nested", (128, 2, 8, True)),
    ("growing", 4, 2, "aligned", (64, 2, 4, True)), ("ring", 4, 1, "flat", (128, 2, 8, False)),
    ("ring", 4, 2, "flat", (128, 2, 8, False))])
def test_wide_query_tiles_in_column_halves_have_the_decode_bits(dev, kdtype, kind, heads, kv, loop,
                                                                shape):
    """lay["wide"] (MUSER_CHUNK_WIDE) at head dim 256, each warpgroup on whole score rows
    (chunk_route._wide): aligned runs at 4 query heads a KV head in 128 query slots, at 2 heads
    in 64 slots at 4 warps, and a ring's chunks (its selects kept: in place, shadow, ring
    decode) at 4 and 2 heads in 128 slots -- all in two value-column halves.  A launch shape, so the
    decode step's bits, chunks of every size and alignment.  Under the interpreter a column
    slice's dot sums by the slice's width (numpy), so there the values are held close, not
    equal: what it checks is the route's indexing (the runs' shift, the halves' columns)."""
    from muser.backends.cuda.chunk_route import chunk_route
    d = 256
    lay = {**_layout(kind, d, 32, loop=loop, park=0), "wide": True}
    rt = chunk_route(97, heads // kv, d, 1, lay, ring=False, window=48 if kind == "ring" else None,
                     dev=False)
    assert (rt.bm, rt.dsplit, rt.warps, rt.align) == shape           # the route under test
    ins = _inputs(heads, kv, d, kdtype, dev, True)
    ref, _, nsplit, cap = _decode(kind, heads, kv, d, kdtype, dev, lay, *ins, d ** -0.5, None)
    seen = set()
    for sizes in SPLITS:
        out, _, routes = _chunks(kind, sizes, heads, kv, d, kdtype, dev, lay, nsplit, cap, *ins,
                                 d ** -0.5, None, 64)
        seen |= routes
        if HAS_CUDA:
            assert torch.equal(out, ref), (sizes, (out.float() - ref.float()).abs().max())
        else:
            torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
    if kind == "ring":
        assert seen == {"in place", "shadow", "ring decode"}
