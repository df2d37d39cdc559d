"""Measured tile tables of `triton_dot.dot_rows` (no Triton needed).

Owns: DOT_TILES / `dot_config` (the decode tiles per projection shape: block_n, the K step, warps,
stages and the split-K piece -- the piece is part of a row's arithmetic, the rest is speed),
`rule_piece` / `table_pieces` (the pieces of shapes the table does not name, and the table's
departures from that rule: what the cut encoding hashes), `chunk_tile` (a chunk's tiles: any
shape, the decode tile's pieces), `tma_tile` / `tma_pays` (the TMA-loaded chunk tiles and where
MUSER_DOT_TMA=auto takes them).  Does not own: the kernels (triton_dot.py).
"""
from __future__ import annotations


# (n, k, glu) -> (block_n, block_k, warps, stages, piece): measured on an H200 at B = 1 and 16
# (benchmarks/cuda_gemv_sweep.py; the 270M's four, the 1B's and the 4B's o projections in a
# graph with the weights from HBM, benchmarks/dot_tiles_graph.py -- the 4B's o 6.69 -> 5.69 us,
# its step 2.770 -> 2.735 ms; its other three were already the graph's best, and its o / down
# split into 1,024- or 2,560-key pieces lost in the step); `piece` (keys per split-K piece)
# depends on the shape only: it is the arithmetic, the rest is speed.
DOT_TILES = {
    (1536, 640, False): (16, 128, 4, 4, 0), (640, 1024, False): (16, 512, 4, 3, 0),
    (2048, 640, True): (32, 128, 4, 4, 0), (640, 2048, False): (32, 512, 4, 3, 0),
    (1536, 1152, False): (16, 256, 4, 4, 0), (1152, 1024, False): (16, 512, 4, 3, 0),
    (6912, 1152, True): (32, 128, 4, 3, 0), (1152, 6912, False): (64, 256, 4, 3, 1024),
    (4096, 2560, False): (32, 256, 4, 4, 0), (10240, 2560, True): (32, 128, 4, 3, 0),
    (2560, 10240, False): (32, 512, 4, 4, 0), (2560, 2048, False): (32, 512, 4, 3, 0),
}


def rule_piece(n: int, k: int) -> int:
    """The split-K piece of a shape the table does not name (a change here moves rows' bits:
    bump triton_attn.ARITHMETIC)."""
    if n >= 65536:                                        # the LM head
        return 0
    return 1024 if k >= 4096 and n <= 4096 else 0        # few output tiles, long K: split K


def table_pieces() -> list:
    """The table's entries whose piece is not the rule's -- what of DOT_TILES is arithmetic
    (the cut encoding hashes it: a speed-only entry leaves the encoding alone)."""
    return sorted([list(key), v[4]] for key, v in DOT_TILES.items()
                  if v[4] != rule_piece(key[0], key[1]))


def dot_config(n: int, k: int, glu: bool) -> tuple[int, int, int, int, int]:
    hit = DOT_TILES.get((n, k, glu))
    if hit:
        return hit
    if n >= 65536:                                        # the LM head
        return 64, 128, 4, 4, rule_piece(n, k)
    return 32, 256, 4, 3, rule_piece(n, k)


CHUNK_ROWS = 64          # from this many rows on, chunk tiles (prefill chunks)
WIDE_ROWS = 2048         # from this many, 128-row tiles (fewer would leave multiprocessors idle)


def chunk_tile(rows: int, glu: bool, piece: int = 0) -> tuple[int, int, int, int, int]:
    """(block_m, block_n, block_k, warps, stages) of a chunk's tiles.  None of it is the
    arithmetic: a row's sums are the k16 MMA steps in order whatever the tile (piece_dot), and
    the split-K pieces stay the decode tile's (`piece`; summed in the kernel from WIDE_ROWS on,
    as programs of their own below).  H200 (benchmarks/dot_chunk_sweep.py, 16k rows, each
    bitwise the decode tile's): 128 x 128 x 64, 8 warps, 3 stages is within 0.97-1.5x cuBLAS on
    the Gemma-3 shapes (gate|up 128 x 64).  Below WIDE_ROWS (a 512-token prompt, every captured
    chunk pass) the tiles timed in a graph with the weights from HBM (chunk_tiles_graph.py,
    twenty-sixth session; us a launch at 512 rows, the tiles before in brackets):

        1B  qkv 11.6 -> 8.1, o 21.1 -> 7.0     64 x 64 x 128, 4 warps, 3 stages (no pieces)
        1B  down 40.6 -> 25.3                  64 x 128 x 64, 4 warps, 4 stages (its pieces)
        1B  gate|up 61.2 -> 39.7 (TMA: 33.8)   128 x 128 x 64, 8 warps, 3 stages
        270M qkv 7.7 -> 5.6, o 9.2 -> 5.5, down 16.1 -> 9.3, gate|up 17.7 -> <= 9.6

    (The tiles before took the decode tile's K step here: 512 for the 1B's o projection.)"""
    if rows >= WIDE_ROWS:
        return (128, 64, 64, 8, 3) if glu else (128, 128, 64, 8, 3)
    if glu:
        return 128, 128, 64, 8, 3
    return (64, 128, 64, 4, 4) if piece else (64, 64, 128, 4, 3)


TMA_AUTO_WEIGHT = 1 << 22   # MUSER_DOT_TMA=auto: weights of at least this many elements


def tma_pays(weight_elements: int, rows: int, graphed: bool = False) -> bool:
    """MUSER_DOT_TMA=auto: whether a 128-row tile of this projection, for a chunk of `rows`
    rows, loads by TMA -- where the weight has TMA_AUTO_WEIGHT elements or more, or the chunk
    has at most WIDE_ROWS rows (a captured chunk pass: the launch's host cost is paid once, at
    the capture).  A TMA launch costs the host more (two tensor descriptors built and encoded a
    call); in an eager pass it pays where the tile saves more than that: the 1B's gate|up
    (2 x 6912 x 1152) and down (1152 x 6912) saved 0.18 ms each at 16k rows, ~92% of its TMA
    gain, while the 270M (every weight < 2.7M elements) is host-bound there and lost 2-8% of its
    16k prefill with every tile on TMA (H200, twenty-second session).  In a graph at 2,048 rows
    TMA tiles won on every shape measured (the 1B's qkv 19.0 -> 14.8 us, o 17.2 -> 13.3; the
    270M's 12.2 -> 9.9, down 19.2 -> 15.4, gate|up 25.9 -> 22.7; twenty-sixth session).
    `graphed`: a chunk of this many rows runs as a captured graph (a long bucket's exact length,
    chunk_graph.takes), so every weight's tile loads by TMA there too."""
    return weight_elements >= TMA_AUTO_WEIGHT or CHUNK_ROWS <= rows <= WIDE_ROWS or graphed


def tma_tile(n: int, k: int, glu: bool, rows: int = WIDE_ROWS) -> tuple[int, int, int, int, int] | None:
    """A 128-row chunk tile loaded by TMA (MUSER_DOT_TMA; speed only, like chunk_tile), or None
    where the pointer tile was faster.  H200, 16k rows (benchmarks/tma_dot_probe.py,
    twenty-first session; ms against the pointer tiles): 1B gate|up 128 x 128 x 4 stages 0.82
    (1.01), down 128 x 256 0.42 (0.61), qkv 0.09 (0.12), o 128 x 128 0.07 (0.08); the 270M's
    gate|up 128 x 64 0.17 (0.20), down 0.07 (0.08) -- and its o projection (640 x 1024) 0.057
    at best against 0.048: a narrow, short product stays on the pointer tile.  Below WIDE_ROWS
    (in a graph, chunk_tiles_graph.py, twenty-sixth session) only gate|up loads by TMA (1B 128 x
    128 x 3 stages 33.8 us at 512 rows against 39.7 on pointers; 270M 128 x 64 x 4 stages 8.6)
    and the large products without pieces (the 4B's); elsewhere 64-row pointer tiles keep twice
    the programs.  At 2,048 rows the 270M's gate|up took 128 x 128 (22.7 us against 25.9; past
    WIDE_ROWS it keeps 128 x 64)."""
    if rows < WIDE_ROWS:
        if glu:
            return (128, 128, 64, 8, 3) if n >= 4096 else (128, 64, 64, 8, 4)
        # the 4B's projections (each >= 4M elements, no pieces) at 512 rows: qkv 31.6 -> 20.1
        # us, o 22.4 -> 15.4, down 109.9 -> 67.8 on 128 x 64 x 4 stages by TMA; the 1B's qkv
        # and o tie (7.9-8.1), the 270M's and any piece-split product lose
        if n * k >= TMA_AUTO_WEIGHT and not dot_config(n, k, glu)[4]:
            return 128, 64, 64, 8, 4
        return None
    if not glu and n < 1024 and k <= 1024:
        return None
    if glu:
        if n >= 4096:
            return 128, 128, 64, 8, 4
        return (128, 128, 64, 8, 3) if rows <= WIDE_ROWS else (128, 64, 64, 8, 3)
    return (128, 256, 64, 8, 3) if k >= 4096 else (128, 128, 64, 8, 3)
