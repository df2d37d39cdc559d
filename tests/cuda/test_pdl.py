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

