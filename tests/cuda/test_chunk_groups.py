"""A long chunk's merge groups one a program (MUSER_CHUNK_GROUPS=on) give the one-program loop's
bits at the engine's own sizes: the 1B / 4B head shapes, the default layout (128-position splits,
16 a group, 64 query slots a tile at 8 warps), prompts spanning several merge groups, from
position 0 and from the middle of a plane -- torch.equal.  The small-size rows against the
decode step itself are in test_triton_chunk.py ("groups"); together: a prefill row's bits do not
depend on the route."""
import pytest
import torch

from cudautil import needs_gpu

pytestmark = needs_gpu


@pytest.mark.parametrize("heads,kv,start,rows", [(4, 1, 0, 5000), (4, 1, 3000, 2100),
                                                 (8, 4, 0, 4500), (4, 1, 0, 2048)])
@pytest.mark.parametrize("softcap", [None, 50.0])
@pytest.mark.parametrize("mode", ["on", "32"])
def test_merge_groups_a_program_give_the_one_program_bits(heads, kv, start, rows, softcap, mode):
    from muser.backends.cuda.triton_attn import layout
    from muser.backends.cuda.triton_chunk import chunk_attention
    from muser.backends.cuda.triton_chunk_park import group_count
    d, dev = 256, "cuda"
    g = torch.Generator(device=dev).manual_seed(rows + start)
    n = start + rows
    q = torch.randn(rows, heads, d, generator=g, device=dev).to(torch.bfloat16)
    k = torch.randn(n, kv, d, generator=g, device=dev).to(torch.bfloat16)
    v = torch.randn(n, kv, d, generator=g, device=dev).to(torch.bfloat16)
    lay = layout(True, d)
    off, on = {**lay, "chunk_groups": "off"}, {**lay, "chunk_groups": mode}
    assert group_count(lay["split"], lay["group"], n) > 1 or n <= lay["split"] * lay["group"]
    want = chunk_attention(q, k, v, start, 0, None, d ** -0.5, softcap, False, off)
    got = chunk_attention(q, k, v, start, 0, None, d ** -0.5, softcap, False, on)
    assert not want.isnan().any()
    assert torch.equal(got, want), (got.float() - want.float()).abs().max()
