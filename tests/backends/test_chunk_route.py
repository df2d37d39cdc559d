"""chunk_route: which launch a chunk's attention takes, pinned on the CPU (the GPU rows hold each
route to the decode kernel's bits; these hold the rules that pick them).  Every case is a
real layout (triton_attn.layout) at a real model's shape."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from muser.backends.cuda.chunk_route import chunk_route
from muser.backends.cuda.triton_attn import layout
from muser.env import Env

GROWING = layout(True, 256)                   # Gemma 3 1B / 270M global layers (D 256)
RING = layout(False, 256)
EAGER = dict(ring=False, window=None, dev=False)


@pytest.mark.parametrize("why, R, G, D, lay, kw, want", [
    ("a long prompt on a global layer at G 4: aligned, wide, flat",
     16384, 4, 256, GROWING, EAGER,
     dict(rows=32, bm=128, dsplit=2, park=False, align=True, live=True, flat=True, tiles=512,
          warps=8)),
    ("the same with MUSER_CHUNK_WIDE off: 64 slots whole",
     16384, 4, 256, layout(True, 256, Env(chunk_wide="off")), EAGER,
     dict(rows=16, bm=64, dsplit=1, align=True, flat=True, tiles=1024, warps=8)),
    ("G 2 (Gemma 3 4B / 12B / 27B): 64 slots are 32 rows, aligned; one warpgroup, in halves",
     4096, 2, 256, GROWING, EAGER,
     dict(rows=32, bm=64, dsplit=2, warps=4, align=True, live=True, flat=True)),
    ("G 2 with MUSER_CHUNK_WIDE off: 64 slots whole at 8 warps",
     4096, 2, 256, layout(True, 256, Env(chunk_wide="off")), EAGER,
     dict(rows=32, bm=64, dsplit=1, warps=8, align=True)),
    ("G 1: 64 rows do not fit one 32-key tile -- not aligned, the nested loop",
     4096, 1, 256, GROWING, EAGER, dict(rows=64, align=False, live=False, flat=False)),
    ("a ring read in place: never aligned (a window's start edge), flat (one-tile splits); "
     "wide at G 4 (its selects kept)",
     4096, 4, 256, RING, dict(EAGER, ring=True, window=512),
     dict(rows=32, bm=128, dsplit=2, warps=8, align=False, flat=True, one=True, heavy=False)),
    ("a sliding layer's long prompt through the shadow: wide, and no heavy order (every "
     "tile sees one window of keys)",
     16384, 4, 256, RING, dict(EAGER, window=512),
     dict(rows=32, bm=128, dsplit=2, warps=8, align=False, heavy=False, tiles=512)),
    ("a sliding layer at G 2 (the 4B's): 128 slots are 64 rows, in halves",
     4096, 2, 256, RING, dict(EAGER, window=1024),
     dict(rows=64, bm=128, dsplit=2, warps=8, align=False)),
    ("a sliding layer at G 1: the default shape (not measured wide)",
     4096, 1, 256, RING, dict(EAGER, window=1024),
     dict(rows=64, bm=64, dsplit=1, warps=8, align=False)),
    ("a captured pass (chunk graph): aligned and wide as an eager one, one tile more for the "
     "shift its start (read on the device) may need",
     2048, 4, 256, GROWING, dict(EAGER, dev=True, positions=32768),
     dict(rows=32, bm=128, dsplit=2, align=True, live=True, flat=True, park=False, tiles=65)),
    ("a captured pass on a ring: wide, its selects kept",
     2048, 4, 256, RING, dict(EAGER, ring=True, window=512, dev=True, positions=32768),
     dict(rows=32, bm=128, dsplit=2, align=False, tiles=64)),
    ("a verification block of 8 rows: parked splits, a tile just large enough",
     8, 4, 256, GROWING, EAGER, dict(park=True, bm=32, rows=8, align=False, dsplit=1)),
    ("MUSER_CHUNK_ALIGN=tiles: aligned, selects of merge_one kept, so nested",
     4096, 4, 256, layout(True, 256, Env(chunk_align="tiles")), EAGER,
     dict(align=True, live=False, flat=False, bm=64, dsplit=1)),
    ("the default order on a growing plane: last query tiles first",
     4096, 4, 256, GROWING, EAGER, dict(heavy=True)),
    ("MUSER_CHUNK_ORDER=light: first query tiles first",
     4096, 4, 256, layout(True, 256, Env(chunk_order="light")), EAGER, dict(heavy=False)),
    ("the flat aligned loop waits for p @ V before its split-end branch (the fence, default), "
     "and loads its whole tiles without row masks",
     16384, 4, 256, GROWING, EAGER, dict(live=True, flat=True, fence=True, whole=True)),
    ("MUSER_CHUNK_WHOLE=off: row masks on every tile",
     16384, 4, 256, layout(True, 256, Env(chunk_whole="off")), EAGER, dict(fence=True,
                                                                            whole=False)),
    ("the whole tiles addressed from one base a program (MUSER_CHUNK_BASE, the default)",
     16384, 4, 256, GROWING, EAGER, dict(whole=True, base=True)),
    ("MUSER_CHUNK_BASE=off: the whole tiles addressed from the view's pointers",
     16384, 4, 256, layout(True, 256, Env(chunk_base="off")), EAGER, dict(whole=True, base=False)),
    ("one base needs whole tiles",
     16384, 4, 256, layout(True, 256, Env(chunk_whole="off")), EAGER,
     dict(whole=False, base=False)),
    ("MUSER_CHUNK_FENCE=off: the same route without it",
     16384, 4, 256, layout(True, 256, Env(chunk_fence="off")), EAGER, dict(flat=True, fence=False)),
    ("no fence where the loop is not flat and aligned: a ring, the nested loop, parked splits",
     4096, 4, 256, RING, dict(EAGER, ring=True, window=512), dict(flat=True, fence=False,
                                                                  whole=False)),
    ("... the nested aligned loop (MUSER_CHUNK_ALIGN=tiles)",
     4096, 4, 256, layout(True, 256, Env(chunk_align="tiles")), EAGER, dict(fence=False,
                                                                             whole=False)),
    ("... a verification block's parked splits",
     8, 4, 256, GROWING, EAGER, dict(park=True, fence=False, whole=False)),
    ("head dim 128 (Cohere2's): aligned, not wide (measured at 256 only)",
     4096, 4, 128, layout(True, 128), EAGER, dict(align=True, dsplit=1, bm=64)),
])
def test_the_route_a_chunk_takes(why, R, G, D, lay, kw, want):
    rt = chunk_route(R, G, D, 0, lay, **kw)
    got = {k: getattr(rt, k) for k in want}
    assert got == want, why


def test_a_caller_s_launch_shape_is_kept():
    """Probes and tests that name a shape get it: wide picks only for the default shape."""
    rt = chunk_route(4096, 4, 256, 0, GROWING, **EAGER, block_m=64, warps=4, dsplit=2)
    assert (rt.bm, rt.warps, rt.dsplit, rt.align) == (64, 4, 2, True)


@given(R=st.integers(1, 40000), start=st.integers(0, 40000), G=st.sampled_from([1, 2, 4, 8]))
def test_the_programs_cover_every_row_once(R, start, G):
    """Tile t covers rows [t * rows - shift, (t + 1) * rows - shift) (shift = start % rows when
    aligned, else 0): the tiles cover rows 0 .. R - 1, and the last tile is not empty."""
    rt = chunk_route(R, G, 256, start, GROWING, **EAGER)
    shift = start % rt.rows if rt.align else 0
    assert rt.tiles * rt.rows - shift >= R > (rt.tiles - 1) * rt.rows - shift
    assert rt.rows * G <= rt.bm
    if rt.align:                    # a run sits in one key tile: no row straddles
        assert GROWING["block_n"] % rt.rows == 0


@given(R=st.integers(1, 2048), start=st.integers(0, 40000), G=st.sampled_from([1, 2, 4, 8]))
def test_a_captured_pass_launches_tiles_for_any_start(R, start, G):
    """A captured pass's grid is fixed at capture, its start read on the device: its tiles cover
    the rows whatever the start's shift, and past them is at most one tile, which the kernel
    runs with no keys (p_max -1: triton_chunk.py)."""
    rt = chunk_route(R, G, 256, 0, GROWING, **dict(EAGER, dev=True, positions=65536))
    shift = start % rt.rows if rt.align else 0
    assert rt.tiles * rt.rows - shift >= R
    empty = sum(1 for t in range(rt.tiles) if t * rt.rows - shift >= R)
    assert empty <= 1 and (empty == 0 or not rt.align or rt.tiles > 1)
    assert rt.align == (not rt.park and GROWING["block_n"] % rt.rows == 0)
