"""The 2025-26 families on the GPU (issue 16): gpt-oss (sinks, experts, YaRN), Gemma 4 (per-layer
geometry, KV sharing, per-layer inputs, with and without experts), OLMo 3, EXAONE 4, Ministral.

gpt-oss, flat Gemma 4, OLMo 3 and EXAONE 4 take the fused decode step, chunks included
(chunk_step.py); Gemma 4 with per-layer inputs or KV sharing runs the CUDA backend's eager path
(`step_weights.unsupported`).  Against the float32 CPU oracle through ring wraps: float32
on the GPU agrees closely (TF32-level); bfloat16 -- the default -- is no worse than twice what
bfloat16 does to the same tiny random model on the CPU (bf16 flips Gemma 4's expert routing
there: worst row 0.43).  A restored session replays bitwise on the GPU."""
import pytest
import torch

from muser.testing import FAMILIES, tiny_model

from cudautil import needs_gpu, rel

pytestmark = needs_gpu


@pytest.fixture(scope="module", params=FAMILIES)
def arch(request):
    return request.param


@pytest.fixture(scope="module")
def oracle(arch):
    return tiny_model(arch, tokenizer=False)


def ids(n, seed=0, vocab=300):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n,), generator=g).tolist()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_each_family_agrees_with_the_cpu_oracle_through_ring_wraps(arch, oracle, dtype):
    def worst(engine):
        a, c = engine.new_session(), oracle.new_session()
        prompt = ids(29, 1)
        la, lc = a.prefill(prompt, chunk_size=8), c.prefill(prompt, chunk_size=8)
        w = rel(la.cpu(), lc)
        for t in ids(24, 2):                   # every ring wraps several times
            w = max(w, rel(a.decode(t).cpu(), c.decode(t)))
        a.check_invariants()
        return w
    gpu = worst(tiny_model(arch, device="cuda", dtype=dtype, tokenizer=False))
    if dtype == "float32":
        bound = 1e-2
    else:                                      # what bf16 alone does to this model, on the CPU
        bound = max(2 * worst(tiny_model(arch, dtype=dtype, quant="none", tokenizer=False)), 0.05)
    print(f"{arch} {dtype}: worst relative error vs the f32 CPU oracle {gpu:.2e} (bound {bound:.2e})")
    assert gpu < bound


def test_each_family_replays_bitwise_after_a_restore_on_the_gpu(arch):
    gpu = tiny_model(arch, device="cuda", dtype="bfloat16", tokenizer=False)
    a = gpu.new_session()
    a.prefill(ids(21, 3), chunk_size=8)
    b = gpu.new_session()
    b.install(a.snapshot())
    for t in ids(9, 4):
        assert torch.equal(a.decode(t), b.decode(t))
    for pa, pb in zip(a.snapshot().planes, b.snapshot().planes):
        assert torch.equal(pa.keys, pb.keys) and torch.equal(pa.values, pb.values)
