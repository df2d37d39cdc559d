"""MUSER_ATTN_O (backends/cuda/triton_decode_o.py): the decode attention launch that also computes
the o projection gives a decode step's logits bitwise the step with its own o launch -- one
session and a batch, rings and growing planes, several steps (the counters end at 0 each time);
and the step takes it only where every layer's o is a plain decode tile.  Under Triton's
interpreter on the CPU (the step uncaptured); on a GPU through the captured step
(tests/cuda/test_pdl.py)."""
import pytest
import torch
from cudautil import HAS_CUDA, needs_kernels

from muser.backends.cuda.graph import GraphRunner
from muser.env import Env
from muser.testing import tiny_model

PROMPTS = ([7, 3, 99], [8, 3, 99, 41], [9, 3, 99, 41, 5])


def _decode(eng, env):
    r = GraphRunner(eng, env, capture=HAS_CUDA)
    ss = [eng.new_session() for _ in PROMPTS]
    for s, p in zip(ss, PROMPTS):
        r.chunk_pass(eng, [s], [p], False, False)
        s.tokens.extend(p)
    out = [r.decode(ss[:1], [5])]                      # one row
    for toks in ([5, 17, 250], [3, 8, 99], [1, 2, 3]):  # three rows, past the ring's window
        out.append(r.decode(ss, toks))
    return r.step, torch.cat(out)


@pytest.mark.interp
@needs_kernels
def test_o_inside_the_attention_gives_the_steps_logits():
    dev, dt = ("cuda", "bfloat16") if HAS_CUDA else ("cpu", "float32")
    eng = tiny_model("gemma3", device=dev, dtype=dt, window=4, tokenizer=False, seed=3,
                     head_dim=32)
    plain_step, plain = _decode(eng, Env())
    step, fused = _decode(eng, Env(attn_o="on"))
    assert not plain_step.attn_o and step.attn_o
    assert not plain.isnan().any() and torch.equal(fused, plain)


@pytest.mark.interp
@needs_kernels
def test_o_stays_a_launch_where_a_layer_cannot_fuse_it():
    """int8 rows (their scale in the epilogue) or MUSER_GEMV=fast: every layer keeps its o launch."""
    from muser.backends.cuda.weights_int8 import quantize_weights
    eng = tiny_model("gemma3", window=4, tokenizer=False, seed=3, head_dim=32)
    assert not GraphRunner(eng, Env(attn_o="on", gemv="fast"), capture=False).step.attn_o
    quantize_weights(eng.weights)
    assert not GraphRunner(eng, Env(attn_o="on"), capture=False).step.attn_o
