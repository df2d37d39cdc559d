"""int8 weight tiles (backends/cuda/triton_dot_loads.py) against the bf16 tiles at a head's and a
layer's size, on a GPU (the layout they compile to, anywhere: test_mma_layouts.py).

Why: a tensor-core MMA sums its 16 products in a fixed internal order, so two tiles agree bit
for bit only if each MMA sees the same k in the same lanes.  Triton lays out a dot operand that
comes from 8-bit loads with four k a lane instead of two (kWidth 4: the k inside each MMA
permuted, the same permutation for x and the weights -- the same sum in exact arithmetic, a
different rounding in about one output in ten thousand).  So a decode tile of int8 weights
summed apart from the bf16 tile (quant="int8-head": the embedded 270M's logits differed from
bf16's in 28 of 262,144 at one row) and from the chunk tiles' wgmma, which reads its weights
from shared memory in one layout (quant="int8": a row decoded != the same row prefilled in a
chunk of 64 rows or more) -- until the tiles stopped Triton from seeing the 8-bit load
(`_layout_fence`, thirty-seventh session).  The interpreter cannot show it (numpy's matmul has
no MMA), and a small matrix rarely meets it: 32,768 x 640 at 16 rows failed 5 of 6 rows under
the old layout (H200).
"""
import pytest
import torch

from cudautil import needs_gpu


@needs_gpu
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


@needs_gpu
@pytest.mark.parametrize("kind", ["bf16", "int8 rows", "blocks"])
def test_a_row_sums_alike_in_the_decode_tile_and_the_chunk_tiles_at_a_layers_size(kind):
    """One arithmetic per token for every weight kind at a real projection's size (the 1B's
    qkv is 1,536 x 1,152; here 8,192 x 1,152: ~10^5 outputs a comparison): 16 rows through the
    decode tile (mma.sync) == the same rows inside a 64-row and a 2,048-row chunk (wgmma
    tiles).  The int8 decode tiles sit behind the layout fence so that their MMA layout is the
    bf16 tile's (test_mma_layouts.py pins that without a GPU); on the H200 the unfenced int8-row
    tile happened to pass this row too (thirty-eighth session), so the layout rule, not this
    row, is what fails if the fence goes -- this row pins decode == chunk for each kind."""
    from muser.backends.cuda.triton_dot import dot_rows
    from muser.backends.cuda.weights_int8 import quantize_blocks, quantize_rows
    n, k = 8192, 1152
    g = torch.Generator().manual_seed(13)
    w = torch.randn(n, k, generator=g) * 0.05
    if kind == "bf16":
        args = {"w": w.to("cuda", torch.bfloat16)}
    else:
        qw = quantize_rows(w) if kind == "int8 rows" else quantize_blocks(w)
        args = {"w": qw.q.cuda(), "scale": qw.scale.cuda()}
    x = torch.randn(2048, k, generator=g).to("cuda", torch.bfloat16)
    decoded = dot_rows(x[:16], rows=16, **args)
    for rows in (64, 2048):
        chunk = dot_rows(x[:rows], **args)[:16]
        assert torch.equal(decoded, chunk), (kind, rows, int((decoded != chunk).sum()))


@needs_gpu
@pytest.mark.parametrize("k", [640, 1152])
@pytest.mark.parametrize("mode", ["widen", "pick"])
def test_the_fast_int8_head_tile_gives_a_row_the_same_bits_in_any_batch(k, mode):
    """quant="int8-head-fast" (weights_int8.HeadInt8): the head's int8 rows through the 16-row
    decode tile without the fence -- Triton's own int8 operand layout, k permuted in each MMA,
    an order no chunk tile shares.  One tile for every row keeps a row's logits one arithmetic
    per token: a row alone == the same row among 16 == among the 100 rows of a prompt's logits
    (rows=16 keeps them out of the chunk tiles), at a head's size; and picking agrees with the
    widened logits' first maximum."""
    from muser.backends.cuda.triton_dot import dot_rows
    from muser.backends.cuda.triton_pick import pick_partials
    from muser.backends.cuda.weights_int8 import quantize_rows
    n = 32768
    g = torch.Generator().manual_seed(17)
    qw = quantize_rows(torch.randn(n, k, generator=g) * 0.05)
    q, s = qw.q.cuda(), qw.scale.cuda()
    x = torch.randn(100, k, generator=g).to("cuda", torch.bfloat16)
    full = dot_rows(x, q, scale=s, rows=16, own_tile=True, widen=True)       # [100, n]
    if mode == "widen":
        for a, z in ((0, 1), (0, 16), (37, 38), (84, 100)):
            got = dot_rows(x[a:z], q, scale=s, rows=16, own_tile=True, widen=True)
            assert torch.equal(got, full[a:z]), (a, z, int((got != full[a:z]).sum()))
    else:
        res = torch.empty(2, 16, dtype=torch.int64, device="cuda")
        vals, idx = dot_rows(x[:16], q, scale=s, rows=16, own_tile=True, pick=True)
        picked = pick_partials(vals, idx, res)[0]
        assert torch.equal(picked, full[:16].argmax(-1))


def test_the_fast_int8_head_tile_is_refused_where_its_order_would_part_the_rows():
    """own_tile=True only with int8 rows through the 16-row decode tile: anywhere else a row
    could meet another tile, in the fenced order, and part from itself."""
    pytest.importorskip("triton")               # (dot_rows builds its kernels first)
    from muser.backends.cuda.triton_dot import dot_rows
    x = torch.zeros(4, 64, dtype=torch.bfloat16)
    q, s = torch.zeros(32, 64, dtype=torch.int8), torch.ones(32)
    with pytest.raises(ValueError, match="got torch.int8 weights, rows=None"):
        dot_rows(x, q, scale=s, own_tile=True)
    with pytest.raises(ValueError, match="got torch.bfloat16 weights, rows=16"):
        dot_rows(x, torch.zeros(32, 64, dtype=torch.bfloat16), rows=16, own_tile=True)
    with pytest.raises(ValueError, match="got torch.int8 weights in blocks, rows=16"):
        dot_rows(x, q, scale=torch.ones(32, 2, dtype=torch.float16), rows=16, own_tile=True)
