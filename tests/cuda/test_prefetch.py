"""MUSER_PREFETCH (backends/cuda/l2_prefetch.py): a decode-attention launch whose extra grid row
asks the copy engine to bring the layer's next weights into the L2 changes where bytes come from,
never a value -- one session's and a batch's logits are bitwise those without it (auto, the
default: steps of one row only)."""
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
@pytest.mark.parametrize("mb", ["auto", "4"])
def test_prefetched_weights_give_the_same_bits(mb):
    eng = tiny_model("gemma3", device="cuda", dtype="bfloat16", window=4, tokenizer=False)
    eng.backend.reset_runner(Env(prefetch="off"))
    plain, plain_b = run(eng), _batch(eng)
    eng.backend.reset_runner(Env(prefetch=mb))
    step = eng.backend.runner(eng).step
    hopper = torch.cuda.get_device_capability()[0] >= 9
    assert any(p is not None for p in step.prefetch) == hopper
    assert torch.equal(run(eng), plain)
    assert torch.equal(_batch(eng), plain_b)
    assert eng.backend.runner(eng).stats["replays"] > 0
