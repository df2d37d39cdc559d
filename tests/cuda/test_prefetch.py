"""MUSER_PREFETCH (backends/cuda/l2_prefetch.py): a decode-attention launch whose extra grid row
asks the copy engine to bring the layer's next weights into the L2 changes where bytes come from,
never a value -- one session's and a batch's logits are bitwise those without it, before or
after the launch's PDL wait (auto, the default: steps of one row only)."""
import pytest
import torch
from cudautil import needs_gpu, prefill_then_decode as run

from muser.env import Env
from muser.testing import tiny_model


def _batch(eng) -> torch.Tensor:
    ss = [eng.new_session() for _ in range(3)]
    for i, s in enumerate(ss):
        s.prefill([7 + i, 3, 99, 41, 5][: 3 + i])
    out = [eng.decode_batch(ss, [5, 17, 250])]
    out.append(eng.decode_batch(ss, [3, 8, 99]))
    return torch.cat(out)


@needs_gpu
@pytest.mark.parametrize("mb, at, qkv, mlp, hint", [("auto", "wait", "off", "off", "normal"),
                                                    ("4", "wait", "off", "off", "normal"),
                                                    ("4", "early", "off", "on", "last"),
                                                    ("auto", "wait", "on", "on", "normal"),
                                                    ("off", "early", "on", "off", "last")])
def test_prefetched_weights_give_the_same_bits(mb, at, qkv, mlp, hint):
    eng = tiny_model("gemma3", device="cuda", dtype="bfloat16", window=4, tokenizer=False)
    eng.backend.reset_runner(Env(prefetch="off"))
    plain, plain_b = run(eng), _batch(eng)
    eng.backend.reset_runner(Env(prefetch=mb, prefetch_programs="16", prefetch_at=at,
                                 prefetch_qkv=qkv, prefetch_mlp=mlp, prefetch_hint=hint))
    step = eng.backend.runner(eng).step
    hopper = torch.cuda.get_device_capability()[0] >= 9
    assert any(p is not None for p in step.prefetch + step.prefetch_qkv + step.prefetch_mlp) \
        == hopper
    assert torch.equal(run(eng), plain)
    assert torch.equal(_batch(eng), plain_b)
    assert eng.backend.runner(eng).stats["replays"] > 0


@needs_gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
                    reason="the bulk prefetch is an sm_90 instruction")
@pytest.mark.parametrize("pieces, early, last", [(False, False, False), (False, True, True),
                                                 (True, False, False), (True, False, True)])
def test_an_add_norm_with_prefetch_programs_stores_the_same_rows(pieces, early, last):
    from muser.backends.cuda.l2_prefetch import plan
    from muser.backends.cuda.triton_ops import add_norm
    torch.manual_seed(0)
    B, N = 3, 1152
    h = torch.randn(B, N, device="cuda", dtype=torch.bfloat16)
    w_next, w_post = (torch.rand(N, device="cuda") + 0.5 for _ in range(2))
    d1 = ((torch.randn(7, B, N, device="cuda"), None) if pieces
          else torch.randn(B, N, device="cuda", dtype=torch.bfloat16))
    big = torch.randn(3 << 20, device="cuda", dtype=torch.bfloat16)      # 6 MB "next weights"
    want = add_norm(h, w_next, 1e-6, False, d1=d1, w_post=w_post)
    pf = plan([big], 4 << 20, 16, 128, early, last)
    got = add_norm(h, w_next, 1e-6, False, d1=d1, w_post=w_post, prefetch=pf)
    assert all(torch.equal(g, w) for g, w in zip(got, want))
