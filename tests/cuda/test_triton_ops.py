"""Fused decode kernels (muser.backends.cuda.triton_ops element-wise, triton_dot projections) against muser.model.transformer."""
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from muser.cache import GrowingPlane, RingPlane
from muser.model import ops

from cudautil import HAS_CUDA, needs_kernels, rel

pytestmark = needs_kernels


@pytest.mark.interp
@pytest.mark.parametrize("layernorm", [False, True])
@pytest.mark.parametrize("mode", ["first", "sandwich", "plain", "parallel"])
def test_add_norm(dev, kdtype, layernorm, mode):
    from muser.backends.cuda.triton_ops import add_norm
    spec = SimpleNamespace(norm="layernorm" if layernorm else "rms", norm_eps=1e-6)
    B, N = 3, 1152
    h, d1, d2 = (torch.randn(B, N).to(dev, kdtype) for _ in range(3))
    wp, wn = torch.randn(N, device=dev), torch.randn(N, device=dev)
    if mode == "first":
        ho, xo = add_norm(h, wn, 1e-6, layernorm)
        rh = h
    elif mode == "sandwich":
        ho, xo = add_norm(h, wn, 1e-6, layernorm, d1=d1, w_post=wp)
        rh = h + ops.norm(d1, wp, spec)
    elif mode == "plain":
        ho, xo = add_norm(h, wn, 1e-6, layernorm, d1=d1)
        rh = h + d1
    else:
        ho, xo = add_norm(h, wn, 1e-6, layernorm, d1=d1, d2=d2)
        rh = h + d1 + d2
    assert rel(ho, rh) < 1e-2 and rel(xo, ops.norm(rh, wn, spec)) < 1e-2


@pytest.mark.interp
@pytest.mark.parametrize("layernorm", [False, True])
@pytest.mark.parametrize("scaled,first_norm", [(True, True), (False, True), (True, False)])
def test_embed_norm_gives_the_embedding_its_scale_and_the_first_norm_bitwise(dev, kdtype,
                                                                            layernorm, scaled,
                                                                            first_norm):
    """One launch == F.embedding, `transformer.embed`'s rounded multiply and add_norm(h, w):
    torch.equal on h and x, int32 and int64 ids, a repeated id; a bad scale is refused."""
    from muser.backends.cuda.triton_ops import add_norm, embed_norm
    V, N = 50, 1152
    g = torch.Generator().manual_seed(3)
    table = torch.randn(V, N, generator=g).to(dev, kdtype)
    ids = torch.tensor([3, 0, 49, 3, 17], device=dev)
    scale = torch.tensor(640 ** 0.5, dtype=kdtype, device=dev) if scaled else None
    wn = torch.randn(N, generator=g).to(dev) if first_norm else None
    rh = F.embedding(ids, table)
    if scaled:
        rh = rh * scale
    for i in (ids, ids.to(torch.int32)):
        h, x = embed_norm(i, table, scale, wn, 1e-6, layernorm)
        assert torch.equal(h, rh)
        if first_norm:
            assert torch.equal(x, add_norm(rh, wn, 1e-6, layernorm)[1])
        else:
            assert x is None
    with pytest.raises(ValueError, match="0-dim"):
        embed_norm(ids, table, torch.ones(1, device=dev), wn, 1e-6, layernorm)


@pytest.mark.interp
@pytest.mark.parametrize("scaled", [False, True])
def test_embed_norm_reads_a_tied_heads_exact_blocks_as_the_float_table(dev, kdtype, scaled):
    """The default's lookup from a tied Q8_0 head's blocks (weights_int8.EmbedBlocks): the
    launch dequantizes each row in the kernel and gives F.embedding of the float table it
    replaced -- h and the first norm's x, torch.equal; an id past the first block row too."""
    from muser.backends.cuda.triton_ops import add_norm, embed_norm
    from muser.backends.cuda.weights_int8 import EmbedBlocks, exact_blocks
    from muser.testing import q8_0_values
    V, N = 50, 640
    g = torch.Generator().manual_seed(4)
    table = q8_0_values(torch.randn(V, N, generator=g) * 0.05, kdtype)
    blocks = exact_blocks(table)
    assert blocks is not None
    rows = EmbedBlocks(type(blocks)(blocks.q.to(dev), blocks.scale.to(dev)), kdtype)
    table = table.to(dev)
    ids = torch.tensor([3, 0, 49, 3, 17], device=dev)
    scale = torch.tensor(640 ** 0.5, dtype=kdtype, device=dev) if scaled else None
    wn = torch.randn(N, generator=g).to(dev)
    h, x = embed_norm(ids, rows, scale, wn, 1e-6, False)
    rh, rx = embed_norm(ids, table, scale, wn, 1e-6, False)
    want = F.embedding(ids, table) * (scale if scaled else 1)
    assert torch.equal(h, rh) and torch.equal(x, rx) and torch.equal(h, want.to(kdtype))
    assert torch.equal(x, add_norm(want.to(kdtype), wn, 1e-6, False)[1])


@pytest.mark.interp
@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("rows,piece", [(1, 0), (16, 0), (70, 0), (5, 32)])
def test_a_widened_dot_holds_the_float_of_the_rounded_dot(dev, kdtype, int8, rows, piece):
    """dot_rows(widen=True) -> float32 == dot_rows(...).float(), torch.equal: the head's
    `.float()` fused into its store (decode tiles, 64-row chunk tiles, and split-K pieces,
    which fall back to the copy)."""
    from muser.backends.cuda.triton_dot import dot_rows
    n, k = 300, 96
    g = torch.Generator().manual_seed(2)
    x = torch.randn(rows, k, generator=g).to(dev, kdtype)
    w = torch.randn(n, k, generator=g)
    kw = {"config": (32, 32, 4, 1, piece)}
    if int8:
        s = w.abs().amax(1) / 127
        w = (w / s[:, None]).round().clamp(-127, 127).to(torch.int8)
        kw["scale"] = s.to(dev)
    w = w.to(dev) if int8 else w.to(dev, kdtype)
    wide = dot_rows(x, w, widen=True, **kw)
    assert wide.dtype == torch.float32 and wide.shape == (rows, n)
    assert torch.equal(wide, dot_rows(x, w, **kw).float())


@pytest.mark.parametrize("layernorm,post", [pytest.param(False, True, marks=pytest.mark.interp),
                                            (False, False), (True, True)])
@pytest.mark.parametrize("int8", [False, True])
def test_an_add_norm_over_unsummed_pieces_gives_the_summed_bits(dev, kdtype, layernorm, post,
                                                                int8):
    """MUSER_FUSE_SUM: the down projection's split-K pieces summed by the add+norm after it
    (one launch) == summed by split_sum_kernel, then the add+norm (two) -- h' and x bitwise,
    bf16 and int8 weights (the int8 row scales applied in the same place)."""
    from muser.backends.cuda.triton_dot import Pieces, dot_rows
    from muser.backends.cuda.triton_ops import add_norm
    B, N, K = 48, 1152, 6912               # the 1B down projection: 7 pieces; 55k sums
    g = torch.Generator().manual_seed(5)
    x = torch.randn(B, K, generator=g).to(dev, kdtype)
    w = (torch.randn(N, K, generator=g) / K ** 0.5).to(dev, kdtype)
    kw = {}
    if int8:
        w = torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8).to(dev)
        kw["scale"] = (torch.rand(N, generator=g) / 500).to(dev)
    h = torch.randn(B, N, generator=g).to(dev, kdtype)
    wp, wn = torch.randn(N, device=dev), torch.randn(N, device=dev)
    pieces = dot_rows(x, w, defer=True, **kw)
    assert isinstance(pieces, Pieces) and pieces.part.shape[0] == 7
    post_w = wp if post else None
    want = add_norm(h, wn, 1e-6, layernorm, d1=dot_rows(x, w, **kw), w_post=post_w)
    got = add_norm(h, wn, 1e-6, layernorm, d1=pieces, w_post=post_w)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.interp
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("rope", [False, True])
def test_qk_rope_store(dev, kdtype, interleaved, qk_norm, rope):
    from muser.backends.cuda.triton_decode import plane_row
    from muser.backends.cuda.triton_ops import qk_rope_store
    H, KV, D, B = 8, 2, 64, 2
    spec = SimpleNamespace(norm="rms", norm_eps=1e-6)
    planes = [RingPlane(0, 8, 100, KV, D, kdtype, dev), GrowingPlane(0, 100, KV, D, kdtype, dev)]
    planes[1].reserve(32)
    qkv = torch.randn(B, (H + 2 * KV) * D).to(dev, kdtype)
    pos = torch.tensor([5, 17], device=dev)
    cos, sin = ops.rope_tables(10000.0, 1.0, D, dev, 64)
    qn = torch.randn(D, device=dev) if qk_norm else None
    kn = torch.randn(D, device=dev) if qk_norm else None
    table = torch.tensor([plane_row(p) for p in planes], dtype=torch.int64, device=dev)
    meta = torch.tensor([[3, 4], [17, 18]], dtype=torch.int64, device=dev)
    q = qk_rope_store(qkv, pos, cos if rope else None, sin if rope else None, qn, kn, 1e-6,
                      table, meta, H, KV, D, interleaved)
    rq = qkv[:, :H * D].view(B, H, D)
    rk = qkv[:, H * D:(H + KV) * D].view(B, KV, D)
    rv = qkv[:, (H + KV) * D:].view(B, KV, D)
    if qk_norm:
        rq, rk = ops.norm(rq, qn, spec), ops.norm(rk, kn, spec)
    if rope:
        rq = torch.cat([ops.apply_rope(rq[b:b + 1], cos[pos[b:b + 1]], sin[pos[b:b + 1]], interleaved)
                        for b in range(B)])
        rk = torch.cat([ops.apply_rope(rk[b:b + 1], cos[pos[b:b + 1]], sin[pos[b:b + 1]], interleaved)
                        for b in range(B)])
    assert rel(q, rq) < 1e-2
    assert rel(planes[0].keys[3], rk[0]) < 1e-2 and torch.equal(planes[0].values[3], rv[0])
    assert rel(planes[1].keys[:, 17], rk[1]) < 1e-2 and torch.equal(planes[1].values[:, 17], rv[1])
    untouched = planes[0].keys.clone()
    untouched[3] = 0
    assert untouched.abs().sum() == 0


@pytest.mark.parametrize("n,k", [(1536, 1152), (1152, 6912), (100, 37), (4096, 2560), (1152, 1024)])
def test_gemv(dev, kdtype, n, k):
    from muser.backends.cuda.triton_gemv import gemv
    x, w = torch.randn(1, k).to(dev, kdtype), torch.randn(n, k).to(dev, kdtype)
    y = torch.full((1, n), float("nan"), dtype=kdtype, device=dev)
    gemv(x, w, out=y)
    assert not y.isnan().any() and rel(y, x.float() @ w.float().T) < 1e-2
    assert torch.equal(y, gemv(x, w))
    for bn, nw in ((1, 4), (4, 8), (16, 4)):              # every tiling computes the same function
        assert rel(gemv(x, w, block_n=bn, warps=nw), x.float() @ w.float().T) < 1e-2


@pytest.mark.parametrize("gelu", [True, False])
@pytest.mark.parametrize("i,k", [(6912, 1152), (50, 24), (10240, 2560)])
def test_gemv_glu(dev, kdtype, gelu, i, k):
    """gate|up GEMV with act*mul fused in == linear, then act_mul (muser.model.transformer.mlp)."""
    from muser.backends.cuda.triton_gemv import gemv
    x, w = torch.randn(1, k).to(dev, kdtype), (torch.randn(2 * i, k) / k ** 0.5).to(dev, kdtype)
    y = torch.full((1, i), float("nan"), dtype=kdtype, device=dev)
    gemv(x, w, out=y, glu=True, gelu=gelu)
    gu = (x.float() @ w.float().T).to(kdtype)
    g, u = gu[:, :i], gu[:, i:]
    ref = (F.gelu(g, approximate="tanh") if gelu else F.silu(g)) * u
    assert not y.isnan().any() and rel(y, ref) < 1e-2
    assert torch.equal(y, gemv(x, w, glu=True, gelu=gelu))


@pytest.mark.parametrize("glu", [False, True])
@pytest.mark.parametrize("n,k", [(1152, 1024), (640, 2048), (100, 37), (1152, 6912), (300, 5000)])
@pytest.mark.parametrize("kernel", ["gemv", "dot_rows"])
def test_gemv_rows_do_not_depend_on_the_batch(dev, kdtype, glu, n, k, kernel):
    """Row b of a B-row call is bitwise the 1-row call on it (the decode step's batch invariance),
    with and without bias."""
    from muser.backends.cuda import triton_dot, triton_gemv
    if kernel == "dot_rows" and not HAS_CUDA:
        pytest.skip("numpy's matmul (the interpreter's dot) is not row-invariant")
    gemv = triton_dot.dot_rows if kernel == "dot_rows" else triton_gemv.gemv
    w = (torch.randn(2 * n if glu else n, k) / k ** 0.5).to(dev, kdtype)
    bias = None if glu else torch.randn(n).to(dev, kdtype)
    x = torch.randn(40, k).to(dev, kdtype)
    full = gemv(x, w, glu=glu, bias=bias)
    for b in (1, 3, 16, 17, 40):
        part = gemv(x[:b], w, glu=glu, bias=bias)
        assert torch.equal(part, full[:b])
    for r in range(40):
        assert torch.equal(gemv(x[r:r + 1], w, glu=glu, bias=bias), full[r:r + 1])
    if not glu:
        ref = x.float() @ w.float().T + bias.float()
        assert rel(full, ref) < 1e-2


@pytest.mark.skipif(not HAS_CUDA, reason="numpy's matmul (the interpreter's dot) is not row-invariant")
@pytest.mark.parametrize("glu", [False, True])
@pytest.mark.parametrize("n,k", [(1152, 1024), (1536, 1152), (6912, 1152), (1152, 6912), (4096, 2560),
                                 (2560, 10240), (262144, 1152)])
def test_a_chunk_tile_gives_each_row_the_decode_tile_bits(dev, kdtype, glu, n, k):
    """dot_rows past CHUNK_ROWS rows takes 64-row tiles (wider, other warps and stages), past
    WIDE_ROWS 128-row tiles with another K step and the split-K pieces summed in the kernel:
    each row is bitwise the 16-row decode tile's row."""
    from muser.backends.cuda.triton_dot import dot_rows
    from muser.backends.cuda.triton_dot_tiles import chunk_tile, dot_config, tma_tile
    if glu and n > 20000:
        pytest.skip("the head has no act*up")
    w = (torch.randn(2 * n if glu else n, k) / k ** 0.5).to(dev, kdtype)
    x = torch.randn(200, k).to(dev, kdtype)
    big = dot_rows(x, w, glu=glu)
    small = torch.cat([dot_rows(x[i:i + 16], w, glu=glu, rows=16) for i in range(0, 200, 16)])
    assert torch.equal(big, small)
    assert torch.equal(big[7:8], dot_rows(x[7:8], w, glu=glu))
    assert torch.equal(dot_rows(x, w, glu=glu, tile=chunk_tile(1 << 14, glu)), small)
    # MUSER_FLATTEN: the in-kernel pieces and their K steps fused into one loop by Triton
    assert torch.equal(dot_rows(x, w, glu=glu, tile=chunk_tile(1 << 14, glu), flatten=True),
                       small)
    # MUSER_DOT_TMA: the same tiles loaded by TMA (triton_dot_tma.py), and its own tiles
    assert torch.equal(dot_rows(x, w, glu=glu, tile=chunk_tile(1 << 14, glu), tma=True),
                       small)
    if tma_tile(n, k, glu):
        assert torch.equal(dot_rows(x, w, glu=glu, tile=tma_tile(n, k, glu), tma=True), small)
    # the tiles below WIDE_ROWS (a captured chunk pass): pointer tiles with the pieces on the
    # grid, and gate|up by TMA
    piece = dot_config(n, k, glu)[4]
    assert torch.equal(dot_rows(x, w, glu=glu, tile=chunk_tile(512, glu, piece)), small)
    if tma_tile(n, k, glu, 512):
        assert torch.equal(dot_rows(x, w, glu=glu, tile=tma_tile(n, k, glu, 512), tma=True),
                           small)
    assert torch.equal(dot_rows(x, w, glu=glu, tma=True), small)


@pytest.mark.interp
@pytest.mark.parametrize("glu,bias", [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize("k,piece", [(96, 0), (256, 64), (200, 64)])
def test_tma_tiles_give_the_pointer_tiles_bits(dev, kdtype, glu, bias, k, piece):
    """dot_tma (tiles loaded by TMA, zero-filled past the rows and keys) == dot_rows' masked
    pointer loads of the same tiles: the same pieces from zero summed in order, the same
    epilogue (bias, act*up) -- 70 rows (a partial row tile), a last piece shorter than the
    others (k = 200), and a tile the route refuses (int8) left to the pointer loads."""
    from muser.backends.cuda.triton_dot import dot_rows
    from muser.backends.cuda.triton_dot_tma import dot_tma, tma_fits
    n, tile = 48, (32, 32, 32, 4, 1)
    g = torch.Generator().manual_seed(k + piece)
    w = (torch.randn(2 * n if glu else n, k, generator=g) / k ** 0.5).to(dev, kdtype)
    x = torch.randn(70, k, generator=g).to(dev, kdtype)
    b = torch.randn(n, generator=g).to(dev, kdtype) if bias else None
    ref = dot_rows(x, w, glu=glu, gelu=True, bias=b, tile=tile, config=(32, 32, 4, 1, piece))
    ks, pieces = (piece, -(-k // piece)) if piece else (-(-k // 32) * 32, 1)
    got = dot_tma(x, w, torch.empty_like(ref), n, glu, True, b, tile, ks, pieces, False)
    assert torch.equal(got, ref)
    assert not tma_fits(x, w.to(torch.int8), 128, 32, ks)
    assert not tma_fits(x, w, 64, 32, ks)              # 64-row tiles: the pointer loads
    if x.is_cuda:
        assert tma_fits(x, w, 128, 32, ks)
        assert not tma_fits(x.view(-1)[1:1 + 69 * k].view(69, k), w, 128, 32, ks)  # unaligned


@pytest.mark.interp
@pytest.mark.parametrize("glu,bias", [(False, False), (False, True), (True, False)])
@pytest.mark.parametrize("piece", [0, 32])
def test_int8_weights_through_dot_rows(dev, kdtype, glu, bias, piece):
    """int8 weights with a float32 scale per row: dot_rows == x @ (scale * q).T, through the
    decode tiles with the split-K pieces summed apart (split_sum) and through 128-row tiles with
    them summed in the kernel -- on a GPU bitwise the same rows; a missing scale is refused."""
    import torch.nn.functional as F
    from muser.backends.cuda.triton_dot import dot_rows
    n, k, R = 40, 96, 70
    g = torch.Generator().manual_seed(1)
    w = torch.randn(2 * n if glu else n, k, generator=g)
    s = w.abs().amax(1) / 127
    q = (w / s[:, None]).round().clamp(-127, 127).to(torch.int8)
    x = torch.randn(R, k, generator=g).to(dev, kdtype)
    b = torch.randn(n, generator=g).to(dev, kdtype) if bias else None
    qd, sd, cfg = q.to(dev), s.to(dev), (16, 32, 4, 1, piece)
    small = torch.cat([dot_rows(x[i:i + 16], qd, glu=glu, bias=b, config=cfg, rows=16, scale=sd)
                       for i in range(0, R, 16)])
    ref = x.float() @ (q.float() * s[:, None]).to(dev).T
    if glu:
        ref = F.silu(ref[:, :n]) * ref[:, n:]
    elif bias:
        ref = ref + b.float()
    assert rel(small, ref) < 2e-2
    big = dot_rows(x, qd, glu=glu, bias=b, config=cfg, tile=(128, 16, 16, 4, 1), scale=sd)
    if HAS_CUDA:
        assert torch.equal(big, small)
    else:                 # the interpreter's dot is numpy's: rows follow the tile (see above)
        assert rel(big, ref) < 2e-2
    with pytest.raises(ValueError, match="float32 scale"):
        dot_rows(x, qd, glu=glu, config=cfg)


@pytest.mark.interp
@pytest.mark.parametrize("glu,piece", [(False, 0), (True, 0), (False, 32), (True, 64)])
def test_block_int8_weights_are_the_dequantized_weights_in_the_tile(dev, kdtype, glu, piece):
    """BlockInt8 (quant="int8-head": int8 with a float16 scale a 32-key block, Q8_0) through
    dot_rows == the same dot_rows over its dequantized weights, bitwise: decode tiles with the
    split-K pieces apart, chunk tiles with them inside, widened and picking -- each weight is
    the activation-dtype value bf16(q * s) before the dot, whatever the tile."""
    from muser.backends.cuda.triton_dot import dot_rows
    from muser.backends.cuda.weights_int8 import quantize_blocks
    n, k, R = 40, 128, 70
    g = torch.Generator().manual_seed(2)
    w = quantize_blocks(torch.randn(2 * n if glu else n, k, generator=g))
    q, s = w.q.to(dev), w.scale.to(dev)
    ref_w = w.dequantized(kdtype).to(dev)
    x = torch.randn(R, k, generator=g).to(dev, kdtype)
    cfg = (16, 32, 4, 1, piece)
    for kw in ({"rows": 16}, {"tile": (128, 16, 16, 4, 1)}, {"rows": 16, "widen": True}) + (
            () if glu or piece else ({"rows": 16, "pick": True},)):
        xs = x[:16] if kw.get("rows") else x
        got = dot_rows(xs, q, glu=glu, config=cfg, scale=s, **kw)
        want = dot_rows(xs, ref_w, glu=glu, config=cfg, **kw)
        for a, b in zip(*((got, want) if kw.get("pick") else ((got,), (want,)))):
            assert torch.equal(a, b), kw
    with pytest.raises(ValueError, match="float16 one of shape"):
        dot_rows(x, q, glu=glu, config=cfg, scale=s.float())


@pytest.mark.interp
def test_block_int8_tile_dequantizes_every_int8_value_at_every_scale_range(dev, kdtype):
    """The tile turns int8 into float32 by the exponent trick (2^23 + q + 128 as bits, less
    2^23 + 128), not by a conversion: every byte -128..127 (Q8_0 stores -127..127, the type
    holds -128 too) at scales from float16's subnormals to its largest must give
    dtype(q * s), the product BlockInt8.dequantized names."""
    from muser.backends.cuda.triton_dot import dot_rows
    from muser.backends.cuda.weights_int8 import BlockInt8
    n, k = 32, 256
    q = (torch.arange(n * k) % 256 - 128).to(torch.int8).reshape(n, k)   # every byte, 32 times
    g = torch.Generator().manual_seed(5)
    # scales from 2^-24 (float16's least subnormal) up to where 128 q still fits the
    # activation dtype (bf16: float16's largest; float16 under the interpreter: 2^8)
    top = 65504.0 if kdtype == torch.bfloat16 else 256.0
    e = torch.randint(-24, 8, (n, k // 32), generator=g).float()
    s = (torch.rand(n, k // 32, generator=g) + 1).mul(e.exp2()).to(torch.float16)
    s[0, 0], s[1, 1], s[2, 2] = top, 2.0 ** -24, 0.0                     # largest, least, 0
    w = BlockInt8(q.contiguous(), s.contiguous())
    x = torch.eye(k)[:16].to(dev, kdtype)          # one-hot rows: the output is w's own column
    got = dot_rows(x, w.q.to(dev), scale=w.scale.to(dev), rows=16, config=(16, 32, 4, 1, 0))
    want = dot_rows(x, w.dequantized(kdtype).to(dev), rows=16, config=(16, 32, 4, 1, 0))
    assert torch.equal(got, want)
    assert torch.equal(got.float(), w.dequantized(kdtype)[:, :16].T.float().to(dev))
