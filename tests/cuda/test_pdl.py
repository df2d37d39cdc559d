"""Programmatic dependent launch (MUSER_PDL=on, backends/cuda/decode_step.py): the decode step's
kernels launched as dependents wait for the kernel before them before anything else, so the
logits of a prefill and of captured decode steps are bitwise those of the plain launches --
also with MUSER_PDL=early, where a projection's decode tile loads its first weights and an
attention program its first K/V tile before the wait (neither depends on the kernel before;
the row the attention stores after the wait is joined by a select; the dots run in the same
order -- the kernels alone: test_triton_ops / test_triton_chunk, "early")."""
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
def test_weights_and_tiles_loaded_early_give_the_plain_launches_bits():
    eng = tiny_model("gemma3", device="cuda", dtype="bfloat16", window=4, tokenizer=False)
    chunk = [(7 * i) % 200 + 3 for i in range(80)]  # 80 rows: chunk tiles, which stay plain
    eng.backend.reset_runner(Env(pdl="off"))
    plain = run(eng, extend=chunk)
    eng.backend.reset_runner(Env(pdl="early"))
    assert eng.backend.runner(eng).step.early == (torch.cuda.get_device_capability()[0] >= 9)
    assert torch.equal(run(eng, extend=chunk), plain)
