"""Decode attention kernels (muser.backends.cuda.triton_decode) against the plain-torch reference:
rings filling and wrapped (read in place, physical order), growing planes across many splits,
several sessions of different lengths in one launch, soft-cap, determinism; the fused form
(qk-norm + RoPE + store + attention in one launch) against the separate kernels, bitwise."""
import pytest
import torch

from muser.attention.reference import attention as reference
from muser.cache import GrowingPlane, RingPlane
from muser.model import ops

from cudautil import needs_kernels, rel

pytestmark = needs_kernels


def filled(kind, n, kv, d, dtype, dev, cap=None, chunk=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    p = (RingPlane(0, cap, 4096, kv, d, dtype, dev) if kind == "ring"
         else GrowingPlane(0, 4096, kv, d, dtype, dev))
    for i in range(0, n, chunk):
        c = min(chunk, n - i)
        p.store(i, torch.randn(c, kv, d, generator=g).to(dev, dtype),
                torch.randn(c, kv, d, generator=g).to(dev, dtype))
    return p


def visible(p):
    """The rows a decode query sees (the kernel reduces them in position order)."""
    return p.logical_rows()


def inputs(planes, dev, **lay):
    """(pos, table, meta, nsplit, capacity, layout) of a decode query at each plane's last row."""
    from muser.backends.cuda.triton_attn import layout
    from muser.backends.cuda.triton_decode import plane_row, splits_for
    growing = planes[0].kind == "growing"
    lay = {**layout(growing, planes[0].head_dim), **lay}
    pos = torch.tensor([p.end - 1 for p in planes], dtype=torch.int64, device=dev)
    table = torch.tensor([plane_row(p) for p in planes], dtype=torch.int64, device=dev)
    meta = torch.tensor([[p.slot(p.end - 1), p.len] for p in planes], dtype=torch.int64, device=dev)
    nsplit = splits_for(planes[0].capacity, growing, lay["split"])
    return pos, table, meta, nsplit, (0 if growing else planes[0].capacity), lay


def run(planes, heads, kv, d, dtype, dev, softcap=None, scale=0.125, sinks=None, **lay):
    from muser.backends.cuda.triton_decode import DecodeWorkspace, decode_attention
    q = torch.randn(len(planes), heads, d).to(dev, dtype)
    pos, table, meta, nsplit, cap, lay = inputs(planes, dev, **lay)
    ws = DecodeWorkspace(len(planes), kv, heads // kv, d, nsplit, dev)
    out = torch.full_like(q, float("nan"))
    decode_attention(q, pos, table, meta, kv, nsplit, scale, softcap, ws=ws, out=out, sinks=sinks,
                     capacity=cap, **lay)
    assert int(ws.cnt.abs().sum()) == 0                 # the election counters are back at 0
    for b, p in enumerate(planes):
        k, v = visible(p)
        mask = torch.ones(1, k.shape[0], dtype=torch.bool, device=dev)
        ref = reference(q[b:b + 1].float(), k.float(), v.float(), mask, scale, softcap,
                        None if sinks is None else sinks.cpu().to(dev))
        assert not out[b].isnan().any()
        assert rel(out[b:b + 1], ref) < 1.5e-2, (p.kind, p.len)
    return q, pos, table, meta, nsplit, cap, out


@pytest.mark.interp
@pytest.mark.parametrize("heads,kv,d", [(4, 1, 256), (8, 4, 256), (4, 2, 16), (16, 4, 128), (16, 2, 512)])
def test_rings_filling_and_wrapped(dev, kdtype, heads, kv, d):
    cap = 64
    planes = [filled("ring", n, kv, d, kdtype, dev, cap=cap, seed=n) for n in (1, 37, 64, 100, 131)]
    assert planes[3].origin_physical != 0           # rotated: read in place, no staging copy
    run(planes, heads, kv, d, kdtype, dev)


@pytest.mark.interp
@pytest.mark.parametrize("n", [1, 5, 300, 2049])
def test_growing_across_splits(dev, kdtype, n):
    planes = [filled("growing", n, 2, 64, kdtype, dev, chunk=257), filled("growing", 3, 2, 64, kdtype, dev)]
    run(planes, 8, 2, 64, kdtype, dev)


@pytest.mark.interp
def test_softcap_and_determinism(dev, kdtype):
    planes = [filled("growing", m, 1, 32, kdtype, dev, chunk=50, seed=m) for m in (700, 90)]
    q, pos, table, meta, nsplit, cap, out = run(planes, 4, 1, 32, kdtype, dev, softcap=3.0, scale=0.3)
    from muser.backends.cuda.triton_decode import decode_attention
    for _ in range(3):
        assert torch.equal(out, decode_attention(q, pos, table, meta, 1, nsplit, 0.3, 3.0))


@pytest.mark.interp
@pytest.mark.parametrize("kind,lens", [("ring", (1, 37, 64, 131)), ("growing", (1, 300, 2049))])
def test_sinks_join_every_head_softmax(dev, kdtype, kind, lens):
    """gpt-oss: a learned per-head logit joins the denominator (large sinks: most mass on them)."""
    planes = [filled(kind, n, 2, 64, kdtype, dev, cap=64, chunk=50, seed=n) for n in lens]
    sinks = torch.tensor([-2.0, 0.0, 1.5, 3.0, 8.0, -30.0, 0.5, 2.0], device=dev)
    q, pos, table, meta, nsplit, cap, out = run(planes, 8, 2, 64, kdtype, dev, sinks=sinks)
    from muser.backends.cuda.triton_decode import decode_attention
    assert torch.equal(out, decode_attention(q, pos, table, meta, 2, nsplit, 0.125, None, sinks=sinks,
                                                capacity=cap))


def _torch_qk(qkv, pos, cos, sin, qn, kn, heads, kv, d, interleaved):
    """q [B, H, D], k [B, KV, D], v [B, KV, D] as muser.model.transformer computes them."""
    from types import SimpleNamespace
    spec = SimpleNamespace(norm="rms", norm_eps=1e-6)
    B = qkv.shape[0]
    q = qkv[:, :heads * d].view(B, heads, d)
    k = qkv[:, heads * d:(heads + kv) * d].view(B, kv, d)
    v = qkv[:, (heads + kv) * d:].view(B, kv, d)
    if qn is not None:
        q, k = ops.norm(q, qn, spec), ops.norm(k, kn, spec)
    if cos is not None:
        q = ops.apply_rope(q, cos[pos], sin[pos], interleaved)
        k = ops.apply_rope(k, cos[pos], sin[pos], interleaved)
    return q, k, v


def _fused_case(kind, lens, heads, kv, d, dtype, dev, cap, qk_norm, rope, interleaved, seed,
                maxnreg=None, early=False):
    """Planes at `lens`, then one decode token per row: fused, separate, fused again
    ([outputs], [planes after each], inputs); `maxnreg` caps every launch's registers; `early`:
    the fused launches read their prologue before the PDL wait (with PDL on an sm_90 GPU)."""
    from muser.backends.cuda.triton_decode import DecodeWorkspace, decode_attention, fused_decode_attention
    from muser.backends.cuda.triton_ops import qk_rope_store
    g = torch.Generator().manual_seed(seed)
    B = len(lens)
    qkv = torch.randn(B, (heads + 2 * kv) * d, generator=g).to(dev, dtype)
    qn = (torch.rand(d, generator=g) + 0.5).to(dev) if qk_norm else None
    kn = (torch.rand(d, generator=g) + 0.5).to(dev) if qk_norm else None
    cos, sin = ops.rope_tables(10000.0, 1.0, d, dev, 4096) if rope else (None, None)
    pos = torch.tensor(lens, dtype=torch.int64, device=dev)
    outs, plane_sets = [], []
    for fused in (True, False, True):
        planes = [filled(kind, n, kv, d, dtype, dev, cap=cap, seed=seed + n) for n in lens]
        meta = []
        for p, n in zip(planes, lens):                 # reserve position n (Plane.store's arithmetic)
            if kind == "ring":
                slot = (p.origin_physical + p.len) % p.capacity
            else:
                p.reserve(n + 1)
                slot = n
            p.append_batch(n, 1)
            meta.append([slot, p.len])
        _, table, _, nsplit, capacity, lay = inputs(planes, dev)
        meta = torch.tensor(meta, dtype=torch.int64, device=dev)
        ws = DecodeWorkspace(B, kv, heads // kv, d, nsplit, dev)
        out = torch.full((B, heads, d), float("nan"), dtype=dtype, device=dev)
        if fused:
            fused_decode_attention(qkv, pos, cos, sin, qn, kn, 1e-6, table, meta, heads, kv, d,
                                   nsplit, 0.0625, None, interleaved, ws=ws, out=out,
                                   capacity=capacity, maxnreg=maxnreg, early=early,
                                   pdl=early and _pdl(dev), **lay)
        else:
            q = qk_rope_store(qkv, pos, cos, sin, qn, kn, 1e-6, table, meta, heads, kv, d, interleaved)
            decode_attention(q, pos, table, meta, kv, nsplit, 0.0625, None, ws=ws, out=out,
                             capacity=capacity, maxnreg=maxnreg, **lay)
        assert int(ws.cnt.abs().sum()) == 0
        outs.append(out)
        plane_sets.append(planes)
    return outs, plane_sets, (qkv, pos, cos, sin, qn, kn)


@pytest.mark.parametrize("kind,lens,cap", [("ring", (1, 37, 64, 100, 131), 64),
                                           ("growing", (0, 4, 300, 2049), None)])
@pytest.mark.parametrize("heads,kv,d", [pytest.param(4, 1, 256, marks=pytest.mark.interp),
                                         (8, 4, 256), (4, 2, 16), (16, 4, 128)])
@pytest.mark.parametrize("qk_norm,rope,interleaved", [(True, True, False), (False, True, True),
                                                      (False, False, False)])
def test_fused_equals_separate_and_reference(dev, kdtype, kind, lens, cap, heads, kv, d, qk_norm,
                                             rope, interleaved):
    (fo, so, fo2), (fp, sp, fp2), inputs = _fused_case(kind, lens, heads, kv, d, kdtype, dev, cap,
                                                       qk_norm, rope, interleaved, seed=len(lens) + d)
    assert not fo.isnan().any()
    assert torch.equal(fo, fo2)                         # deterministic
    # the same maths as the separate kernels; bitwise only up to the compiler's choice of
    # reduction trees (a qk-norm sum, the MMA accumulation) in the two specializations
    assert rel(fo, so) < 1e-2
    for a, b, c in zip(fp, sp, fp2):
        assert torch.equal(a.keys, c.keys) and torch.equal(a.values, c.values)
        assert torch.equal(a.values, b.values) and rel(a.keys, b.keys) < 1e-2
    q, k_new, v_new = _torch_qk(*inputs, heads, kv, d, interleaved)
    for b, p in enumerate(fp):                          # against plain torch + the reference
        slot = (p.origin_physical + p.len - 1) % p.capacity if p.kind == "ring" else lens[b]
        row_k = p.keys[slot] if p.kind == "ring" else p.keys[:, slot]
        row_v = p.values[slot] if p.kind == "ring" else p.values[:, slot]
        assert rel(row_k, k_new[b]) < 1e-2 and torch.equal(row_v, v_new[b])
        k, v = visible(p)
        mask = torch.ones(1, k.shape[0], dtype=torch.bool, device=dev)
        ref = reference(q[b:b + 1].float(), k.float(), v.float(), mask, 0.0625, None)
        assert rel(fo[b:b + 1], ref) < 1.5e-2, (p.kind, lens[b])


def _same_bits(one, other):
    """Two `_fused_case` runs: every output and every stored K/V row bitwise equal."""
    for a, b in zip(one[0], other[0]):
        assert not a.isnan().any() and torch.equal(a, b)
    for pa, pb in zip(one[1], other[1]):
        for a, b in zip(pa, pb):
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


@pytest.mark.parametrize("kind,lens,cap", [("ring", (1, 37, 64, 100, 131), 64),
                                           ("growing", (0, 4, 300, 2049), None)])
@pytest.mark.parametrize("maxnreg", [168, 128])
def test_a_register_cap_is_allocation_not_bits(dev, kdtype, kind, lens, cap, maxnreg):
    """A capped launch (MUSER_ATTN_REGS: what a step of 8+ sessions runs) gives every output
    and stored row bitwise what the uncapped one gives, fused and q-given."""
    one = _fused_case(kind, lens, 4, 1, 256, kdtype, dev, cap, True, True, False, seed=3)
    capped = _fused_case(kind, lens, 4, 1, 256, kdtype, dev, cap, True, True, False, seed=3,
                         maxnreg=maxnreg)
    _same_bits(one, capped)


def _pdl(dev) -> bool:
    return torch.device(dev).type == "cuda" and torch.cuda.get_device_capability(dev)[0] >= 9


@pytest.mark.interp
@pytest.mark.parametrize("kind,lens,cap", [("ring", (1, 37, 64, 100, 131), 64),
                                           ("growing", (0, 4, 300, 2049), None)])
@pytest.mark.parametrize("qk_norm,rope", [(True, True), (False, False)])
def test_an_early_prologue_is_timing_not_bits(dev, kdtype, kind, lens, cap, qk_norm, rope):
    """MUSER_ATTN_EARLY: the launch that reads its table, slot, length, position, rotation and
    norm weights before the PDL wait (idle splits leaving without it) gives every output and
    stored row bitwise what the wait-first launch gives -- a growing plane's grid is mostly
    idle splits, so both kinds of program are in every launch."""
    one = _fused_case(kind, lens, 4, 1, 256, kdtype, dev, cap, qk_norm, rope, False, seed=5)
    early = _fused_case(kind, lens, 4, 1, 256, kdtype, dev, cap, qk_norm, rope, False, seed=5,
                        early=True)
    _same_bits(one, early)


@pytest.mark.interp
@pytest.mark.parametrize("split", [64, 128, 512])
def test_positions_per_split(dev, kdtype, split):
    """Fewer, longer splits compute the same attention (to rounding: a different fold)."""
    planes = [filled("growing", n, 1, 64, kdtype, dev, chunk=300, seed=n) for n in (2049, 130, 1)]
    run(planes, 4, 1, 64, kdtype, dev, split=split)
