"""Which register cap a decode step gives its attention launch (MUSER_ATTN_REGS, read by
backends/cuda/decode_step.DecodeStep.regs_for): register allocation only, so the bits are the
kernel tests' to pin (tests/cuda/test_triton_decode.py -k register_cap); this pins the choice."""
from types import SimpleNamespace

import pytest

from muser.backends.cuda.decode_step import DecodeStep
from muser.env import Env, read
from muser.errors import EnvError


@pytest.mark.parametrize("knob,batch,cap", [
    ("auto", 1, None), ("auto", 7, None), ("auto", 8, 168), ("auto", 16, 168),
    ("off", 16, None), ("168", 1, 168), ("128", 16, 128)])
def test_the_attention_is_capped_from_eight_sessions_by_default(knob, batch, cap):
    assert DecodeStep.regs_for(SimpleNamespace(attn_regs=knob), batch) == cap


def test_the_default_is_auto_and_a_bad_cap_is_refused():
    assert Env().attn_regs == "auto"
    with pytest.raises(EnvError, match="MUSER_ATTN_REGS"):
        read({"MUSER_ATTN_REGS": "200"})
