"""The BlockInt8 tile (quant="int8-head", backends/cuda/triton_dot_loads.py) against the bf16 tile
over the same weights, at a head's size, on a GPU.

Why a GPU and a head's size: a tensor-core MMA sums its 16 products in a fixed internal order,
so two tiles agree bit for bit only if each MMA sees the same k in the same lanes.  Triton
lays out a dot operand that comes from 8-bit loads with four k a lane instead of two (kWidth 4:
the k inside each MMA permuted, the same permutation for x and the weights -- the same sum in
exact arithmetic, a different rounding in about one output in ten thousand).  The embedded
270M's int8-head logits differed from bf16's in 28 of 262,144 at one row until the tile stopped
Triton from seeing the 8-bit load (thirty-seventh session).  The interpreter cannot show it
(numpy's matmul has no MMA), and a small matrix rarely meets it: 32,768 x 640 at 16 rows is
~50 expected differences under the old layout.
"""
import pytest
import torch

from cudautil import needs_gpu

pytestmark = needs_gpu


@pytest.mark.parametrize("k", [640, 1152])
@pytest.mark.parametrize("mode", ["plain", "widen", "pick"])
def test_block_int8_tile_is_the_bf16_tile_bit_for_bit_at_a_heads_size(k, mode):
    from muser.backends.cuda.triton_dot import dot_rows
    from muser.backends.cuda.weights_int8 import quantize_blocks
    n = 32768
    g = torch.Generator().manual_seed(11)
    blocks = quantize_blocks(torch.randn(n, k, generator=g) * 0.05)
    q, s = blocks.q.cuda(), blocks.scale.cuda()
    w = blocks.dequantized(torch.bfloat16).cuda()
    x = torch.randn(16, k, generator=g).to("cuda", torch.bfloat16)
    kw = {"widen": True} if mode == "widen" else {"pick": True} if mode == "pick" else {}
    for rows in (x[:1], x):                           # one row, and a 16-row decode tile
        got = dot_rows(rows, q, scale=s, rows=16, **kw)
        want = dot_rows(rows, w, rows=16, **kw)
        for a, b in zip(*((got, want) if mode == "pick" else ((got,), (want,)))):
            assert torch.equal(a, b), (mode, rows.shape[0], int((a != b).sum()))
