"""MUSER_DOT_CPP=norm's host side (backends/cuda/step_norm.py), without a GPU: which models may
leave their add+norms to the projections -- only the layer shape csrc/triton_math.cuh replays
(sandwich RMS norms, no parallel block, no MoE, no layer scale) -- and that a pending norm
answers what the step asks of an x before it is made.  The bits are tests/cuda/test_cpp_dot.py's."""
import pytest
import torch

from muser.backends.cuda.step_norm import Pending, norm_later, ready
from muser.testing import tiny_model

KERNEL = object()          # stands for a loaded CppDot: norm_later only asks whether there is one


@pytest.mark.parametrize("arch,cpp,variant,want", [
    ("gemma3", KERNEL, "norm", True),
    ("gemma3", KERNEL, "on", False),           # the projections only
    ("gemma3", None, "norm", False),           # the kernel did not load: add_norm as before
    ("cohere2", KERNEL, "norm", False),        # a parallel block under a LayerNorm
    ("llama", KERNEL, "norm", False),          # no post-norm: nothing for the tree to replay
])
def test_only_sandwich_rms_layers_leave_the_norm_to_the_projection(arch, cpp, variant, want):
    eng = tiny_model(arch, layers=2, tokenizer=False)
    assert norm_later(eng.spec, eng.weights, cpp, variant) is want


def test_a_pending_norm_has_its_rows_shape_and_is_left_alone_when_already_made():
    h = torch.zeros(3, 64)
    p = Pending(h, h, torch.ones(64), torch.ones(64), torch.empty_like(h))
    assert p.shape == (3, 64)                  # via_dot reads the rows off an x
    assert ready(None, h) is h                 # a made x passes through
