"""The lean chunk route (triton_chunk_lean.py: the group's and total's state in memory) gives a
growing plane's chunk rows the decode step's bits -- the same rows as the nested loop of
chunk_kernel, for chunks of many sizes, across many splits and merge groups (torch.equal)."""
import pytest
import torch

from muser.cache import stage

import test_triton_chunk as T
from cudautil import needs_kernels

pytestmark = needs_kernels


def _lean_chunks(sizes, heads, kv, d, dtype, dev, lay, nsplit, qkv, qn, kn, cos, sin, scale,
                 softcap, warps):
    from muser.backends.cuda.triton_chunk_lean import lean_attention
    from muser.backends.cuda.triton_decode import prepare_rows
    plane = T._plane("growing", kv, d, dtype, dev)
    outs, at = [], 0
    for c in sizes:
        pos = torch.arange(at, at + c, device=dev)
        q, k, v = prepare_rows(qkv[at:at + c], pos, cos, sin, qn, kn, 1e-6, heads, kv, d, nsplit,
                               False, capacity=0, **lay)
        st = stage(plane, at, k, v)
        assert st.ordered
        outs.append(lean_attention(q, st.keys, st.values, at, st.first_position, scale, softcap,
                                   False, lay, warps=warps))
        st.commit()
        at += c
    return torch.cat(outs)


@pytest.mark.parametrize("tiles,group,sizes,warps", [
    (2, 2, [T.N], 4), (1, 3, [1, 7, 97, 45], 4), (3, 2, [50, 1, 1, 98], 8)])
@pytest.mark.parametrize("heads,kv,d,qk_norm,softcap", [(4, 2, 32, True, None), (4, 1, 64, False, 5.0)])
def test_a_lean_chunk_row_has_the_decode_bits(dev, kdtype, tiles, group, sizes, warps, heads, kv, d,
                                              qk_norm, softcap):
    scale = d ** -0.5
    lay = T._layout("growing", d, 16, group, tiles=tiles)
    ins = T._inputs(heads, kv, d, kdtype, dev, qk_norm)
    ref, _, nsplit, _ = T._decode("growing", heads, kv, d, kdtype, dev, lay, *ins, scale, softcap)
    out = _lean_chunks(sizes, heads, kv, d, kdtype, dev, lay, nsplit, *ins, scale, softcap, warps)
    bad = (out.float() - ref.float()).abs().amax(dim=(1, 2)).gt(0).nonzero().flatten().tolist()
    assert torch.equal(out, ref), f"rows {bad[:10]} differ"
