"""MUSER_DOT_CPP=norm's glue in the decode step (step_norm.Pending through DecodeStep._add_norm
and _dot), with the C++ kernel replaced by what it must equal -- add_norm, then dot_rows: a
pending norm the kernel takes comes back as its projection with h' in the buffer the step
already holds; one it does not take is the add_norm launch into that same buffer; the norm
before the head is never deferred.  The kernel's own bits: tests/cuda/test_cpp_dot.py."""
from types import SimpleNamespace

import pytest
import torch
from cudautil import needs_kernels

pytestmark = needs_kernels


class FakeCpp:
    """Stands in for cpp_dot.CppDot: takes every norm-in offered (`take`) or none, and no plain
    projection; its 'kernel' is add_norm then dot_rows, so the glue is what is under test."""

    def __init__(self, take: bool):
        self.take, self.norms = take, []

    def plan(self, *args):
        return None

    def norm_plan(self, h, d1, w_post, w_next, w, n, glu, gelu, piece, layernorm):
        return (int(glu), w.shape[1], 2, 1) if self.take else None

    def norm(self, h, d1, w_post, w_next, eps, w, n, plan, pdl, h_out=None):
        from muser.backends.cuda.triton_dot import dot_rows
        from muser.backends.cuda.triton_ops import add_norm
        self.norms.append(plan)
        h_out, x = add_norm(h, w_next, eps, False, d1=d1, w_post=w_post, h_out=h_out)
        return h_out, dot_rows(x, w, glu=bool(plan[0]), gelu=bool(plan[0]))


def step_with(cpp):
    from muser.backends.cuda.decode_step import DecodeStep
    from muser.backends.cuda.triton_dot import dot_rows
    step = DecodeStep.__new__(DecodeStep)          # only what _add_norm and _dot read
    step.spec, step.layernorm, step.pdl = SimpleNamespace(norm_eps=1e-6), False, False
    step.norm_later, step.cpp, step.gemv = True, cpp, dot_rows
    step.tma, step.flatten, step.graph_rows = "off", False, frozenset()
    return step


@pytest.mark.interp
@pytest.mark.parametrize("take", [True, False])
def test_a_pending_norm_ends_as_add_norm_then_the_projection(dev, kdtype, take):
    from muser.backends.cuda.step_norm import Pending
    from muser.backends.cuda.triton_dot import dot_rows
    from muser.backends.cuda.triton_ops import add_norm
    g = torch.Generator().manual_seed(3)
    h, d1 = (torch.randn(2, 64, generator=g).to(dev, kdtype) for _ in range(2))
    wp, wn = (1 + torch.rand(2, 64, generator=g)).to(dev).unbind(0)
    w = (torch.randn(64, 64, generator=g) / 8).to(dev, kdtype)       # gate|up: 2 x 32 rows
    cpp = FakeCpp(take)
    step = step_with(cpp)
    h_out, x = step._add_norm(h, wn, d1, wp)
    assert isinstance(x, Pending) and x.h_out is h_out
    y = step._dot(x, w, glu=True, gelu=True)
    h_want, x_want = add_norm(h, wn, 1e-6, False, d1=d1, w_post=wp)
    assert torch.equal(h_out, h_want)                # h' in the buffer the step holds
    assert torch.equal(y, dot_rows(x_want, w, glu=True, gelu=True))
    assert len(cpp.norms) == int(take)


@pytest.mark.interp
def test_the_norm_before_the_head_is_not_deferred(dev, kdtype):
    step = step_with(FakeCpp(True))
    h, d1 = (torch.randn(2, 64).to(dev, kdtype) for _ in range(2))
    wp, wn = torch.ones(2, 64, device=dev).unbind(0)
    h_out, x = step._add_norm(h, wn, d1, wp, later=False)
    assert isinstance(x, torch.Tensor) and x.shape == h.shape
