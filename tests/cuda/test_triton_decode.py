"""Decode attention kernel (muser.attention.triton_decode) against the plain-torch reference:
rings filling and wrapped (read in place, physical order), growing planes across many splits,
several sessions of different lengths in one launch, soft-cap, determinism."""
import pytest
import torch

from muser.attention.reference import attention as reference
from muser.cache import GrowingPlane, RingPlane

from cudautil import needs_kernels, rel

pytestmark = needs_kernels


def filled(kind, n, kv, d, dtype, dev, cap=None, chunk=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    p = (RingPlane(0, cap, 1 << 20, kv, d, dtype, dev) if kind == "ring"
         else GrowingPlane(0, 1 << 20, kv, d, dtype, dev))
    for i in range(0, n, chunk):
        c = min(chunk, n - i)
        p.store(i, torch.randn(c, kv, d, generator=g).to(dev, dtype),
                torch.randn(c, kv, d, generator=g).to(dev, dtype))
    return p


def visible(p):
    """The rows a decode query sees, in the order the kernel reduces them (physical)."""
    if p.kind == "ring":
        return p.keys[:p.len], p.values[:p.len]
    return p.logical_rows()


def run(planes, heads, kv, d, dtype, dev, softcap=None, scale=0.125):
    from muser.attention.triton_decode import decode_attention, plane_row, splits_for
    growing = planes[0].kind == "growing"
    q = torch.randn(len(planes), heads, d).to(dev, dtype)
    table = torch.tensor([plane_row(p) for p in planes], dtype=torch.int64, device=dev)
    meta = torch.tensor([[0, p.len] for p in planes], dtype=torch.int64, device=dev)
    nsplit = splits_for(planes[0].capacity, growing)
    out = torch.full_like(q, float("nan"))
    decode_attention(q, table, meta, kv, nsplit, scale, softcap, out=out)
    for b, p in enumerate(planes):
        k, v = visible(p)
        mask = torch.ones(1, k.shape[0], dtype=torch.bool, device=dev)
        ref = reference(q[b:b + 1].float(), k.float(), v.float(), mask, scale, softcap)
        assert not out[b].isnan().any()
        assert rel(out[b:b + 1], ref) < 1.5e-2, (p.kind, p.len)
    return q, table, meta, nsplit, out


@pytest.mark.parametrize("heads,kv,d", [(4, 1, 256), (8, 4, 256), (4, 2, 16), (16, 4, 128)])
def test_rings_filling_and_wrapped(dev, kdtype, heads, kv, d):
    cap = 64
    planes = [filled("ring", n, kv, d, kdtype, dev, cap=cap, seed=n) for n in (1, 37, 64, 100, 131)]
    assert planes[3].origin_physical != 0           # rotated: read in place, no staging copy
    run(planes, heads, kv, d, kdtype, dev)


@pytest.mark.parametrize("n", [1, 5, 300, 2049])
def test_growing_across_splits(dev, kdtype, n):
    planes = [filled("growing", n, 2, 64, kdtype, dev, chunk=257), filled("growing", 3, 2, 64, kdtype, dev)]
    run(planes, 8, 2, 64, kdtype, dev)


def test_softcap_and_determinism(dev, kdtype):
    planes = [filled("growing", m, 1, 32, kdtype, dev, chunk=50, seed=m) for m in (700, 90)]
    q, table, meta, nsplit, out = run(planes, 4, 1, 32, kdtype, dev, softcap=3.0, scale=0.3)
    from muser.attention.triton_decode import decode_attention
    again = decode_attention(q, table, meta, 1, nsplit, 0.3, 3.0)
    assert torch.equal(out, again)
