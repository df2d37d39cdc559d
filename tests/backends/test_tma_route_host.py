"""MUSER_DOT_TMA=auto: which projections' 128-row chunk tiles load by TMA, and the chunk tiles
below WIDE_ROWS rows (no GPU needed).

`tma_pays` takes the weights of 4M elements or more in an eager pass past WIDE_ROWS rows: on the
H200 the 1B's gate|up and down carried ~92% of the TMA tiles' gain, while the 270M -- every
weight under 2.7M elements -- is host-bound at 16k rows and lost 2-8% with every tile on TMA
(benchmarks/RESULTS.md, twenty-second session).  Chunks of CHUNK_ROWS..WIDE_ROWS rows run as
captured graphs, where a launch's host cost is paid once: every weight there (twenty-sixth
session).  The bits do not depend on the route (tests/cuda/test_triton_ops.py)."""
import pytest

from muser.backends.cuda.triton_dot_tiles import (CHUNK_ROWS, TMA_AUTO_WEIGHT, WIDE_ROWS,
                                                  chunk_tile, tma_pays, tma_tile)


@pytest.mark.parametrize("what,rows,k,takes", [
    ("1B gate|up", 2 * 6912, 1152, True), ("1B down", 1152, 6912, True),
    ("1B qkv", 1536, 1152, False), ("1B o", 1152, 1024, False),
    ("270M gate|up", 2 * 2048, 640, False), ("270M down", 640, 2048, False),
    ("270M qkv", 1536, 640, False), ("270M o", 640, 1024, False),
    ("4B o", 2560, 2048, True), ("4B qkv", 4096, 2560, True),
])
def test_auto_takes_tma_tiles_only_for_large_weights(what, rows, k, takes):
    assert tma_pays(rows * k, 16384) is takes, what


@pytest.mark.parametrize("rows,takes", [(16, False), (CHUNK_ROWS - 1, False), (CHUNK_ROWS, True),
                                        (512, True), (WIDE_ROWS, True), (WIDE_ROWS + 1, False)])
def test_a_captured_chunk_takes_tma_tiles_for_every_weight(rows, takes):
    """The 270M's qkv (1536 x 640): on TMA from CHUNK_ROWS to WIDE_ROWS rows (the chunk graphs'
    buckets), not in a decode step (16-row tiles) nor in an eager pass past WIDE_ROWS."""
    assert tma_pays(1536 * 640, rows) is takes


@pytest.mark.parametrize("rows,n,k,glu,piece,tile,tma", [
    (512, 1536, 1152, False, 0, (64, 64, 128, 4, 3), None),          # 1B qkv
    (512, 1152, 6912, False, 1024, (64, 128, 64, 4, 4), None),       # 1B down: pieces on the grid
    (512, 6912, 1152, True, 0, (128, 128, 64, 8, 3), (128, 128, 64, 8, 3)),    # 1B gate|up
    (512, 2048, 640, True, 0, (128, 128, 64, 8, 3), (128, 64, 64, 8, 4)),      # 270M gate|up
    (2048, 2048, 640, True, 0, (128, 64, 64, 8, 3), (128, 128, 64, 8, 3)),
    (16384, 2048, 640, True, 0, (128, 64, 64, 8, 3), (128, 64, 64, 8, 3)),
    (2048, 1536, 1152, False, 0, (128, 128, 64, 8, 3), (128, 128, 64, 8, 3)),
    (2048, 640, 1024, False, 0, (128, 128, 64, 8, 3), None),
    (512, 4096, 2560, False, 0, (64, 64, 128, 4, 3), (128, 64, 64, 8, 4)),     # 4B qkv
    (512, 2560, 10240, False, 0, (64, 64, 128, 4, 3), (128, 64, 64, 8, 4)),    # 4B down
    (512, 1152, 6912, False, 1024, (64, 128, 64, 4, 4), None),   # 1B down: its pieces on the grid
])
def test_the_chunk_tiles_measured_in_a_graph(rows, n, k, glu, piece, tile, tma):
    """chunk_tile / tma_tile below and past WIDE_ROWS: the tiles benchmarks/chunk_tiles_graph.py
    timed fastest (speed fields only)."""
    assert chunk_tile(rows, glu, piece) == tile
    assert tma_tile(n, k, glu, rows) == tma


def test_the_auto_bound_is_inclusive():
    assert tma_pays(TMA_AUTO_WEIGHT, 16384) and not tma_pays(TMA_AUTO_WEIGHT - 1, 16384)


@pytest.mark.parametrize("rows,graphed,takes", [(16384, False, False), (16384, True, True),
                                                (3072, True, True), (16, False, False)])
def test_a_long_chunk_run_as_a_graph_takes_tma_tiles_for_every_weight(rows, graphed, takes):
    """The 270M's qkv past WIDE_ROWS: eager, the pointer tile (the TMA launch's host cost); in a
    long bucket's graph (chunk_graph.takes: paid once at the capture) TMA (H200, 16k rows: the
    1B's qkv 0.12 -> 0.09 ms, o 0.08 -> 0.07)."""
    assert tma_pays(1536 * 640, rows, graphed) is takes
