"""MUSER_NORM_IN on the GPU (bfloat16): an add+norm left to the projection that reads its x
(dot_rows' norm prologue, decode_step `_add_norm`) gives every logit the default step gives --
decode steps, a batch of sessions, prefill chunks of several sizes and a greedy run, bitwise --
so the rows stay one arithmetic (device_plan.sh norm_in also runs test_invariance.py's CUDA
rows -- alone == batched == chunk rows == verification rows -- with MUSER_NORM_IN=16).

The engines: Gemma 3 (sandwich norms: both add+norms of a layer fuse, all but the final norm,
which stays its own launch), Cohere2 (parallel block: nothing fuses, nothing changes), OLMo 3 (post-norm: the
next layer reads h itself, nothing to fuse)."""
import pytest
import torch

from cudautil import needs_gpu

from muser.env import Env
from muser.testing import tiny_model

pytestmark = needs_gpu

PROMPTS = ([(5 * j + 3) % 300 + 3 for j in range(13)], [(7 * j + 1) % 300 + 3 for j in range(6)],
           [(11 * j + 2) % 300 + 3 for j in range(21)])


@pytest.fixture(scope="module", params=["gemma3", "cohere2", "olmo3"])
def engine(request):
    return tiny_model(request.param, device="cuda", dtype="bfloat16", window=4, tokenizer=False)


def outputs(engine, norm_in: str):
    """Logits of: each prompt prefilled (chunks of 5), 4 decode steps alone, then 3 steps of the
    three sessions batched; a prompt prefilled in one chunk and in chunks of 1; a greedy run."""
    engine.backend.reset_runner(Env(norm_in=norm_in))
    out, sessions = [], []
    for p in PROMPTS:
        s = engine.new_session()
        out.append(s.prefill(p, chunk_size=5))
        for t in (9, 4, 33, 8):
            out.append(s.decode(t))
        sessions.append(s)
    for t in (12, 40, 7):
        out.append(engine.decode_batch(sessions, [t, t + 1, t + 2]))
    for chunk in (64, 1):
        out.append(engine.new_session().prefill(PROMPTS[2], chunk_size=chunk))
    run = engine.decode_greedy([_prefilled(engine, p) for p in PROMPTS[:2]], [5, 6], 6,
                               stop_ids=())
    return out, run.tokens


def _prefilled(engine, prompt):
    s = engine.new_session()
    s.prefill(prompt)
    return s


def test_a_norm_left_to_the_projection_gives_the_default_bits(engine):
    want, want_tokens = outputs(engine, "off")
    got, got_tokens = outputs(engine, "16")
    step = engine.decode_runner().step
    if engine.spec.sandwich_norm:          # the switch did something: Gemma 3's norms fuse
        assert step._takes_norm("qkv", step.fused[1]["wqkv"], 1)
        assert step._takes_norm("gu", step.fused[0]["wgu"], 16)
        assert not step._takes_norm("gu", step.fused[0]["wgu"], 17)
    assert got_tokens == want_tokens
    for a, b in zip(got, want):
        assert torch.equal(a, b)
