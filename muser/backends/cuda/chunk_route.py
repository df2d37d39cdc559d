"""Which launch a chunk's attention takes: its shape and loop, decided on the host.

Owns: `chunk_route(...)` -> `ChunkRoute` -- for one chunk of R query rows over one layer, the
query slots a program takes, the value-column slices, whether splits are parked and folded
after, whether programs take aligned runs of positions (and so leave the selects out), the
flat or nested loop, the launch order, the grid and the warps.  Pure Python (no Triton, no
tensor): the rules are pinned on the CPU (tests/backends/test_chunk_route.py).  Does not own:
the kernel and its launch (triton_chunk.py), the workspace and the fold (triton_chunk_park.py),
the reduction shape -- split, group, key tile -- which is the arithmetic (triton_attn.layout).

Every field here is a speed choice: a row's bits are the layout's whichever route runs (each
route is held to the decode kernel by tests/cuda/test_triton_chunk.py).  Worked example, the
1B's 16k prompt on a global layer (G = 4 query heads a KV head, D = 256, key tiles of 32):

    eager, growing, no window    -> aligned runs (32 rows = one key tile each), no selects
    G x block_n == 128, D >= 256 -> wide: 128 slots = 32 rows x 4 heads, 2 column halves
    chunk_loop "aligned"         -> the flat loop
    grid                         -> (16,384 / 32 = 512 tiles, 1 KV head, 2 halves), 8 warps
"""
from __future__ import annotations

from dataclasses import dataclass

from .triton_chunk_park import park_rows, park_splits
from .triton_pieces import _pow2

CHUNK_ROWS = 64               # query slots per program on the GPU (a decode step has 16)
CHUNK_WARPS = 8               # at 64 slots: 4 warps spill the [64, D] states (H200: 3x slower)
WIDE_SLOTS = 128              # query slots a program on lay["wide"]'s launch shapes (_wide)


def _wide(G: int, block_n: int, live: bool, window: int | None) -> tuple[int, int, int] | None:
    """lay["wide"] (MUSER_CHUNK_WIDE) at head dim 256: (query slots, value-column slices, warps)
    where each warpgroup owns whole rows of the score tile, or None (the default shape).  Why:
    at 64 slots and 8 warps a [64, 32] score tile is split over the two warpgroups by key
    (sm_90: m64n16 wgmma), so the row max, the sums and p cross shared memory every tile.  At
    128 slots each warpgroup owns 64 rows whole (m64n32); at 4 warps one warpgroup owns all 64.
    The column halves keep the [slots, 128] float32 states in registers (each half recomputes
    the scores).  Measured on the H200 (fa_ceiling.py --parts wide,others; 16k rows):

        aligned run, G x block_n = 128 (1B/270M global)  128 slots, 8 warps   5.39 -> 3.95 ms
        aligned run, G x block_n =  64 (G 2: 4B..27B)     64 slots, 4 warps  10.10 -> 8.34 ms
        sliding, G 4, window 512 (selects kept)          128 slots, 8 warps   0.40 -> 0.30 ms
        sliding, G 2, window 1024 (the 4B's)             128 slots, 8 warps   1.38 -> 1.03 ms
        (a G 2 global run at 128 slots is 64 rows: two key tiles, not aligned -- 9.6 -> 11.6)"""
    if live and G * block_n == WIDE_SLOTS:            # one aligned run a program
        return WIDE_SLOTS, 2, 8
    if live and G * block_n == CHUNK_ROWS:
        return CHUNK_ROWS, 2, 4
    if window and G in (2, 4):
        return WIDE_SLOTS, 2, 8
    return None


@dataclass(frozen=True)
class ChunkRoute:
    rows: int        # query rows a program (its slots / G)
    bm: int          # the kernel's slot tile: a power of two >= rows * G, >= 16
    dsplit: int      # value-column slices, one a program (grid axis 2 unless parked)
    park: bool       # one split a program, the partials folded after (triton_chunk_park.py)
    nsp: int         # split programs a parked tile (1 unless park)
    align: bool      # programs take ROWS-aligned runs: tile t starts at t * rows - start % rows
    live: bool       # align with no selects at all (merge_live); False under align "tiles"
    flat: bool       # one loop over the key tiles, split and group ends inside it
    one: bool        # one-tile splits, each started by tile_first
    heavy: bool      # the last query tiles (the most keys) start first
    fence: bool      # the flat aligned loop waits for p @ V before its split-end branch (speed only)
    whole: bool      # the flat aligned loop loads unmasked tiles without row masks (speed only)
    base: bool       # ... and addresses them from one base a program (speed only)
    tiles: int       # programs along the rows
    warps: int


def _slots(block_m: int, G: int) -> tuple[int, int]:
    """(query rows a program, the kernel's slot tile: a power of two >= rows * G, >= 16)."""
    rows = max(1, block_m // G)
    return rows, max(16, _pow2(rows * G))


def chunk_route(R: int, G: int, D: int, start: int, lay: dict, *, ring: bool, window: int | None,
                dev: bool, positions: int | None = None, block_m: int = CHUNK_ROWS,
                warps: int | None = None, dsplit: int | None = None) -> ChunkRoute:
    """The route of R query rows at positions start.. (G query heads a KV head, head dim D) on a
    layer laid out as `lay`: `ring` (a ring read in place), `window`, `dev` (a captured pass:
    its place read on the device, `positions` a bound on every position it can hold; the
    chunk's own K/V rows apart from the history change no route).  block_m / warps / dsplit: a caller's
    launch shape (tests, probes); left at their defaults the route picks."""
    half = D // 2
    # slices of at least 16 columns (a dot's narrowest side)
    dsplit = max(1, min(dsplit or lay.get("dsplit", 1), 2 * _pow2(half, 8) // 16))
    park = park_rows(lay) >= R and dsplit == 1 and (not dev or positions is not None)
    if park:                                  # a tile just large enough for the chunk
        block_m = min(block_m, max(16, _pow2(R * G)))
    rows, bm = _slots(block_m, G)
    # lay["align"] (MUSER_CHUNK_ALIGN, on by default): aligned row runs on a growing plane,
    # eager and captured passes -- without tile_step's keeping select and merge_one's selects
    # (merge_live); "tiles": without the first only.  A run must sit in one key tile
    # (block_n % rows == 0), and no window may start inside the keys (rings, sliding planes);
    # the flat loop takes it with "on" only (_flat_tile_live: no selects at all)
    align = (bool(lay.get("align")) and not ring and not window and not park
             and (lay.get("chunk_loop") != "flat" or lay.get("align") is True)
             and lay.get("flatten") not in ("chunk", "on") and lay["block_n"] % rows == 0)
    live = align and lay.get("align") is True
    if (lay.get("wide") and block_m == CHUNK_ROWS and dsplit == 1 and warps is None
            and not park and 2 * _pow2(half, 8) >= 256):
        block_m, dsplit, warps = _wide(G, lay["block_n"], live, window) or (block_m, 1, None)
        rows, bm = _slots(block_m, G)          # wide keeps an aligned run in one key tile
    # chunk_loop "aligned" (auto on longer growing splits): flat on such runs, nested elsewhere
    flat = lay.get("chunk_loop") == "flat" or (lay.get("chunk_loop") == "aligned" and live)
    one = (bool(lay.get("first_tile")) and lay["split"] == lay["block_n"]
           and bool(lay.get("acc_dot")))
    # aligned runs shift the tiles by start % rows; a captured pass reads its start on the
    # device, so it launches for the largest shift (a last tile past the chunk walks no key)
    tiles = -(-(R + ((rows - 1 if dev else start % rows) if align else 0)) // rows)
    nsp = park_splits(rows, lay["split"], window, positions if dev else start + R) if park else 1
    return ChunkRoute(rows=rows, bm=bm, dsplit=dsplit, park=park, nsp=nsp, align=align,
                      live=live, flat=flat, one=one,
                      heavy=bool(lay.get("heavy")) and not ring and not window,
                      fence=bool(lay.get("fence")) and live and flat,      # MUSER_CHUNK_FENCE
                      whole=bool(lay.get("whole")) and live and flat,      # MUSER_CHUNK_WHOLE
                      base=bool(lay.get("base")) and bool(lay.get("whole")) and live and flat,
                      tiles=tiles, warps=warps or (CHUNK_WARPS if block_m >= 64 else lay["warps"]))
