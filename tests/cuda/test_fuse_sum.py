"""MUSER_FUSE_SUM (backends/cuda/decode_step.py): the down projection's split-K pieces summed by
the add+norm after it, in one launch, give the engine the bits of split_sum + add_norm -- a
prefill, captured decode steps, and a verification-sized extend (a chunk graph's small bucket).
The kernel-level pin: test_triton_ops.py::test_an_add_norm_over_unsummed_pieces_gives_the_summed_bits
(on the interpreter too)."""
import torch
from cudautil import needs_gpu, prefill_then_decode

from muser.env import Env
from muser.testing import tiny_model


def run(engine):
    return prefill_then_decode(engine, extend=[4, 9, 12])


@needs_gpu
def test_pieces_summed_in_the_add_norm_give_the_split_sum_bits():
    # hidden 2048: the MLP's intermediate is 4096, so the down projection splits K in pieces
    eng = tiny_model("gemma3", device="cuda", dtype="bfloat16", window=4, tokenizer=False,
                     hidden=2048, heads=8, kv_heads=2, head_dim=256)
    eng.backend.reset_runner(Env(fuse_sum="off"))
    plain = run(eng)
    eng.backend.reset_runner(Env(fuse_sum="on"))
    assert eng.backend.runner(eng).step.fuse_sum
    assert torch.equal(run(eng), plain)
    assert eng.backend.runner(eng).stats["replays"] > 0
