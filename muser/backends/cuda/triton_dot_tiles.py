"""Measured tile tables of `triton_dot.dot_rows` (no Triton needed).

Owns: DOT_TILES / `dot_config` (the decode tiles per projection shape: block_n, the K step, warps,
stages and the split-K piece -- the piece is part of a row's arithmetic, the rest is speed) and
`chunk_tile` (a chunk's tiles: any shape, the decode tile's pieces), `tma_tile` / `tma_pays` (the
TMA-loaded chunk tiles and where MUSER_DOT_TMA=auto takes them).  Does not own: the kernels
(triton_dot.py).
"""
from __future__ import annotations


# (n, k, glu) -> (block_n, block_k, warps, stages, piece): measured on an H200 at B = 1 and 16
# (benchmarks/cuda_gemv_sweep.py; the 270M's four and the 1B's o projection in a graph with the
# weights from HBM, benchmarks/dot_tiles_graph.py); `piece` (keys per split-K piece) depends on
# the shape only: it is the arithmetic, the rest is speed.
DOT_TILES = {
    (1536, 640, False): (16, 128, 4, 4, 0), (640, 1024, False): (16, 512, 4, 3, 0),
    (2048, 640, True): (32, 128, 4, 4, 0), (640, 2048, False): (32, 512, 4, 3, 0),
    (1536, 1152, False): (16, 256, 4, 4, 0), (1152, 1024, False): (16, 512, 4, 3, 0),
    (6912, 1152, True): (32, 128, 4, 3, 0), (1152, 6912, False): (64, 256, 4, 3, 1024),
    (4096, 2560, False): (32, 256, 4, 4, 0), (10240, 2560, True): (32, 128, 4, 3, 0),
    (2560, 10240, False): (32, 512, 4, 4, 0),
}


# (n, k, glu) -> the K step a chunk tile keeps where the decode tile's moved after the chunk
# tiles were measured (chunk_tile takes the decode tile's K step below WIDE_ROWS)
CHUNK_K = {(1536, 640, False): 256, (640, 1024, False): 256, (2048, 640, True): 256,
           (640, 2048, False): 256}


def dot_config(n: int, k: int, glu: bool) -> tuple[int, int, int, int, int]:
    hit = DOT_TILES.get((n, k, glu))
    if hit:
        return hit
    if n >= 65536:                                        # the LM head
        return 64, 128, 4, 4, 0
    piece = 1024 if k >= 4096 and n <= 4096 else 0      # few output tiles, long K: split K
    return 32, 256, 4, 3, piece


CHUNK_ROWS = 64          # from this many rows on, chunk tiles (prefill chunks)
WIDE_ROWS = 2048         # from this many, 128-row tiles (fewer would leave multiprocessors idle)


def chunk_tile(rows: int, bk: int, glu: bool) -> tuple[int, int, int, int, int]:
    """(block_m, block_n, block_k, warps, stages) of a chunk's tiles.  None of it is the
    arithmetic: a row's sums are the k16 MMA steps in order whatever the tile (piece_dot), and
    the split-K pieces stay the decode tile's (summed in the kernel, in order).  H200
    (benchmarks/dot_chunk_sweep.py, 16k rows, each bitwise the decode tile's): 128 x 128 x 64,
    8 warps, 3 stages is within 0.97-1.5x cuBLAS on the Gemma-3 shapes (gate|up 128 x 64).
    Below WIDE_ROWS the 64-row tiles of the previous sweep, with the decode tile's K step."""
    if rows >= WIDE_ROWS:
        return (128, 64, 64, 8, 3) if glu else (128, 128, 64, 8, 3)
    if glu:
        return 64, 64, bk, 8, (2 if bk <= 256 else 1)
    return (64, 128, bk, 8, 2) if bk <= 256 else (64, 64, bk, 4, 1)


TMA_AUTO_WEIGHT = 1 << 22   # MUSER_DOT_TMA=auto: weights of at least this many elements


def tma_pays(weight_elements: int) -> bool:
    """MUSER_DOT_TMA=auto: whether a 128-row tile of this projection loads by TMA -- only where
    the weight has TMA_AUTO_WEIGHT elements or more.  A TMA launch costs the host more (two
    tensor descriptors built and encoded a call); it pays where the tile saves more than that:
    the 1B's gate|up (2 x 6912 x 1152) and down (1152 x 6912) saved 0.18 ms each at 16k rows,
    ~92% of its TMA gain, while the 270M (every weight < 2.7M elements) is host-bound and lost
    2-8% of its 16k prefill with every tile on TMA (H200, twenty-second session)."""
    return weight_elements >= TMA_AUTO_WEIGHT


def tma_tile(n: int, k: int, glu: bool) -> tuple[int, int, int, int, int] | None:
    """A 128-row chunk tile loaded by TMA (MUSER_DOT_TMA; speed only, like chunk_tile), or None
    where the pointer tile was faster.  H200, 16k rows (benchmarks/tma_dot_probe.py,
    twenty-first session; ms against the pointer tiles): 1B gate|up 128 x 128 x 4 stages 0.82
    (1.01), down 128 x 256 0.42 (0.61), qkv 0.09 (0.12), o 128 x 128 0.07 (0.08); the 270M's
    gate|up 128 x 64 0.17 (0.20), down 0.07 (0.08) -- and its o projection (640 x 1024) 0.057
    at best against 0.048: a narrow, short product stays on the pointer tile."""
    if not glu and n < 1024 and k <= 1024:
        return None
    if glu:
        return (128, 128, 64, 8, 4) if n >= 4096 else (128, 64, 64, 8, 3)
    return (128, 256, 64, 8, 3) if k >= 4096 else (128, 128, 64, 8, 3)
