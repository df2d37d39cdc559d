"""Programmatic dependent launch (MUSER_PDL=on, backends/cuda/decode_step.py): the decode step's
kernels launched as dependents wait for the kernel before them before anything else, so the
logits of a prefill and of captured decode steps are bitwise those of the plain launches."""
import torch
from cudautil import needs_gpu, prefill_then_decode as run

from muser.env import Env
from muser.testing import tiny_model


@needs_gpu
def test_dependent_launches_give_the_plain_launches_bits():
    eng = tiny_model("gemma3", device="cuda", dtype="bfloat16", window=4, tokenizer=False)
    eng.backend.reset_runner(Env(pdl="off"))
    plain = run(eng)
    eng.backend.reset_runner(Env(pdl="on"))
    assert eng.backend.runner(eng).step.pdl == (torch.cuda.get_device_capability()[0] >= 9)
    assert torch.equal(run(eng), plain)
    assert eng.backend.runner(eng).stats["replays"] > 0


@needs_gpu
def test_an_early_attention_prologue_gives_the_same_bits():
    """MUSER_ATTN_EARLY=on (the default): the decode attention reads its tables, slot, length,
    position and constants before the PDL wait (none is written by the launch before it) and its
    idle splits leave without waiting -- one session's and a batch's logits are the wait-first
    step's."""
    from test_prefetch import _batch
    eng = tiny_model("gemma3", device="cuda", dtype="bfloat16", window=4, tokenizer=False)
    eng.backend.reset_runner(Env(attn_early="off"))
    assert not eng.backend.runner(eng).step.attn_early
    plain, plain_b = run(eng), _batch(eng)
    eng.backend.reset_runner(Env(attn_early="on"))
    assert eng.backend.runner(eng).step.attn_early == (torch.cuda.get_device_capability()[0] >= 9)
    assert torch.equal(run(eng), plain)
    assert torch.equal(_batch(eng), plain_b)
    assert eng.backend.runner(eng).stats["replays"] > 0
