"""Chunk attention on CUDA (muser.backends.cuda.prefill) against the reference: the window as a
band (flash attention, no dense mask), grouped-query heads, strided K/V views of a head-major plane."""
import pytest
import torch

from muser.attention.reference import attention as reference
from muser.attention.reference import visibility_mask

from cudautil import needs_gpu, rel

pytestmark = needs_gpu


@pytest.mark.parametrize("heads,kv,d", [(4, 1, 256), (8, 4, 256), (4, 2, 16), (16, 4, 128)])
@pytest.mark.parametrize("window", [None, 1, 7, 64])
@pytest.mark.parametrize("t,history", [(16, 0), (48, 100), (64, 300), (1, 40)])
def test_banded_matches_reference(heads, kv, d, window, t, history):
    from muser.backends.cuda.prefill import CudaAttention
    att = CudaAttention()
    dt = torch.bfloat16
    s = history + t
    q = torch.randn(t, heads, d, device="cuda", dtype=dt)
    # K/V as a head-major plane's span: [KV, S, D] storage viewed as [S, KV, D]
    k = torch.randn(kv, s + 5, d, device="cuda", dtype=dt)[:, :s].transpose(0, 1)
    v = torch.randn(kv, s + 5, d, device="cuda", dtype=dt)[:, :s].transpose(0, 1)
    q_start, k_start = 1000 + history, 1000
    out = att.banded(q, k, v, q_start, k_start, window, 0.0625, None)
    qp = torch.arange(q_start, q_start + t, device="cuda")
    kp = torch.arange(k_start, k_start + s, device="cuda")
    ref = reference(q.float(), k.float(), v.float(), visibility_mask(qp, kp, window), 0.0625)
    assert att.stats["flash"] == 1, att.last_error
    assert rel(out, ref) < 1.5e-2


def test_unaligned_and_softcap_fall_back_correctly():
    from muser.backends.cuda.prefill import CudaAttention
    att = CudaAttention()
    q = torch.randn(8, 4, 32, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(20, 2, 32, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(20, 2, 32, device="cuda", dtype=torch.bfloat16)
    for q_start, softcap in [(15, None), (12, 5.0)]:     # 15 + 8 != 0 + 20: unaligned
        out = att.banded(q, k, v, q_start, 0, 6, 0.2, softcap)
        mask = visibility_mask(torch.arange(q_start, q_start + 8, device="cuda"),
                               torch.arange(20, device="cuda"), 6)
        assert rel(out, reference(q.float(), k.float(), v.float(), mask, 0.2, softcap)) < 1.5e-2
    assert att.stats["flash"] == 0


@pytest.mark.parametrize("window,history", [(None, 0), (128, 300), (7, 40)])
def test_sinks_ride_on_flash(window, history):
    """gpt-oss's sinks: flash attention's log-sum-exp rescales each row (no dense mask)."""
    from muser.backends.cuda.prefill import CudaAttention
    att = CudaAttention()
    t, s = 48, 48 + history
    q = torch.randn(t, 8, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(s, 2, 64, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(s, 2, 64, device="cuda", dtype=torch.bfloat16)
    sinks = torch.tensor([-2.0, 0.0, 1.5, 3.0, 8.0, -30.0, 0.5, 2.0], device="cuda")
    out = att.banded(q, k, v, history, 0, window, 0.125, None, sinks)
    mask = visibility_mask(torch.arange(history, s, device="cuda"), torch.arange(s, device="cuda"), window)
    ref = reference(q.float(), k.float(), v.float(), mask, 0.125, None, sinks)
    assert att.stats["flash"] == 1, att.last_error
    assert rel(out, ref) < 1.5e-2


def test_head_dim_512_takes_sdpa_and_leaves_flash_on():
    """Gemma 4's global layers (head dim 512) are past flash's limit: SDPA for them, flash still
    on for the next 256-dim layer."""
    from muser.backends.cuda.prefill import CudaAttention
    att = CudaAttention()
    for d in (512, 256):
        q = torch.randn(16, 4, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(16, 2, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(16, 2, d, device="cuda", dtype=torch.bfloat16)
        out = att.banded(q, k, v, 0, 0, None, d ** -0.5, None)
        mask = visibility_mask(torch.arange(16, device="cuda"), torch.arange(16, device="cuda"), None)
        assert rel(out, reference(q.float(), k.float(), v.float(), mask, d ** -0.5)) < 1.5e-2
    assert att.flash_ok and att.stats["flash"] == 1 and att.stats["sdpa"] == 1
