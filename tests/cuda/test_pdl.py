"""Programmatic dependent launch (MUSER_PDL=on, backends/cuda/decode_step.py): the decode step's
kernels launched as dependents wait for the kernel before them before anything else, so the
logits of a prefill and of captured decode steps are bitwise those of the plain launches."""
import pytest
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
@pytest.mark.parametrize("attn,dot,o", [("on", "off", "off"), ("off", "on", "off"),
                                        ("on", "on", "on"), ("off", "off", "on")])
def test_work_before_the_wait_gives_the_same_bits(attn, dot, o):
    """MUSER_ATTN_EARLY=on: the decode attention reads its tables, slot, length, position and
    constants before the PDL wait (none is written by the launch before it) and its idle splits
    leave without waiting; MUSER_DOT_EARLY=on: each projection program asks the L2 for its
    weight rows before it; MUSER_ATTN_O=on: the attention launch computes o too (its o row
    waits on a counter) -- one session's and a batch's logits are the plain step's."""
    from test_prefetch import _batch
    eng = tiny_model("gemma3", device="cuda", dtype="bfloat16", window=4, tokenizer=False)
    eng.backend.reset_runner(Env())
    plain, plain_b = run(eng), _batch(eng)
    eng.backend.reset_runner(Env(attn_early=attn, dot_early=dot, attn_o=o))
    step = eng.backend.runner(eng).step
    hopper = torch.cuda.get_device_capability()[0] >= 9
    assert (step.attn_early, step.dot_early) == (hopper and attn == "on", hopper and dot == "on")
    assert step.attn_o == (o == "on")
    assert torch.equal(run(eng), plain)
    assert torch.equal(_batch(eng), plain_b)
    assert eng.backend.runner(eng).stats["replays"] > 0
