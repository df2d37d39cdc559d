"""The CUDA backend's chunk attention (backends/cuda/prefill.py) on CPU tensors: its plain-torch
routes -- the banded call when flash attention is not available (an explicit window mask through
SDPA, or the float32 reference with a soft-cap) -- against the reference, the way a CUDA chunk
takes them (grouped-query heads, strided K/V views of a head-major plane, windows, unaligned
spans)."""
import pytest
import torch

from muser.attention.reference import attention as reference
from muser.attention.reference import visibility_mask
from muser.backends.cuda.prefill import CudaAttention


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def operands(t, history, heads, kv, d, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    s = history + t
    q = torch.randn(t, heads, d, generator=g).to(dtype)
    # K/V as a head-major plane's span: [KV, S + 5, D] storage viewed as [S, KV, D]
    k = torch.randn(kv, s + 5, d, generator=g).to(dtype)[:, :s].transpose(0, 1)
    v = torch.randn(kv, s + 5, d, generator=g).to(dtype)[:, :s].transpose(0, 1)
    return q, k, v


def expected(q, k, v, q_start, k_start, window, scale, softcap):
    qp = torch.arange(q_start, q_start + q.shape[0])
    kp = torch.arange(k_start, k_start + k.shape[0])
    return reference(q.double(), k.double(), v.double(), visibility_mask(qp, kp, window), scale, softcap)


@pytest.mark.parametrize("heads,kv,d", [(4, 1, 32), (8, 4, 16), (4, 2, 16)])
@pytest.mark.parametrize("window", [None, 1, 7, 64])
@pytest.mark.parametrize("t,history", [(16, 0), (48, 100), (1, 40)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_banded_without_flash_matches_the_reference(heads, kv, d, window, t, history, dtype):
    att = CudaAttention()
    att.flash_ok = False                                  # a torch without the flash op
    q, k, v = operands(t, history, heads, kv, d, dtype, seed=t + history)
    out = att.banded(q, k, v, 1000 + history, 1000, window, 0.0625, None)
    assert out.dtype == dtype and out.shape == q.shape
    tol = 1e-5 if dtype == torch.float32 else 1.5e-2
    assert rel(out, expected(q, k, v, 1000 + history, 1000, window, 0.0625, None)) < tol
    route = "reference" if dtype == torch.float32 else "sdpa"
    assert att.stats == {"flash": 0, "sdpa": int(route == "sdpa"), "reference": int(route == "reference")}


@pytest.mark.parametrize("q_start, softcap", [(15, None), (12, 5.0), (12, None)])
def test_unaligned_spans_and_softcap_take_the_mask_route(q_start, softcap):
    """q_start + T != k_start + S (unaligned) or a soft-cap: never flash, always an explicit mask."""
    att = CudaAttention()
    q, k, v = operands(8, 12, 4, 2, 32, torch.bfloat16, seed=q_start)
    out = att.banded(q, k, v, q_start, 0, 6, 0.2, softcap)
    assert rel(out, expected(q, k, v, q_start, 0, 6, 0.2, softcap)) < 1.5e-2
    assert att.stats["flash"] == 0


def test_a_failing_flash_call_is_remembered_and_the_answer_stays_right():
    """On CPU tensors the flash op refuses; the object records why, stops trying, and answers
    through the mask route (what a CUDA build without the op's features does)."""
    att = CudaAttention()
    if not att.flash_ok:
        pytest.skip("this torch has no _flash_attention_forward op")
    q, k, v = operands(16, 16, 4, 1, 32, torch.bfloat16)
    out = att.banded(q, k, v, 16, 0, 8, 0.1, None)
    assert not att.flash_ok and att.last_error
    assert att.stats["flash"] == 0 and att.stats["sdpa"] == 1
    assert rel(out, expected(q, k, v, 16, 0, 8, 0.1, None)) < 1.5e-2


def test_plain_call_routes():
    """The mask-taking call: a soft-cap or float32 -> the reference; else SDPA (GQA heads repeated)."""
    att = CudaAttention()
    q, k, v = operands(5, 3, 8, 2, 16, torch.bfloat16)
    mask = visibility_mask(torch.arange(3, 8), torch.arange(8), None)
    for softcap in (None, 30.0):
        out = att(q, k, v, mask, 0.25, softcap)
        ref = reference(q.double(), k.double(), v.double(), mask, 0.25, softcap)
        assert rel(out, ref) < 1.5e-2
    out = att(q.float(), k.float(), v.float(), None, 0.25)             # no mask: every key visible
    ones = torch.ones(5, 8, dtype=torch.bool)
    assert rel(out, reference(q.double(), k.double(), v.double(), ones, 0.25)) < 1e-5
    assert att.stats == {"flash": 0, "sdpa": 1, "reference": 2}


def test_sinks_join_a_finished_softmax_through_its_log_sum_exp():
    """prefill._join_sinks: attention without sinks and its log-sum-exp -> the reference with
    sinks (the flash route's arithmetic, checked on the CPU in float32)."""
    from muser.backends.cuda.prefill import _join_sinks
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(5, 4, 8, generator=g), torch.randn(9, 2, 8, generator=g),
               torch.randn(9, 2, 8, generator=g))
    mask = visibility_mask(torch.arange(4, 9), torch.arange(9), 6)
    sinks = torch.tensor([-1.0, 0.5, 4.0, -20.0])
    plain = reference(q, k, v, mask, 0.3)
    scores = torch.einsum("thd,shd->hts", q, k.repeat_interleave(2, dim=1)) * 0.3
    lse = torch.logsumexp(scores.masked_fill(~mask, float("-inf")), dim=-1)        # [H, T]
    assert torch.allclose(_join_sinks(plain, lse, sinks), reference(q, k, v, mask, 0.3, None, sinks),
                          atol=1e-6)
