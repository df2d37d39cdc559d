"""l2_prefetch.plan: which bytes a decode-attention launch asks the L2 for (MUSER_PREFETCH).
CPU-only: the plan is host arithmetic over tensors' addresses and sizes."""
import pytest
import torch

from muser.backends.cuda.l2_prefetch import CHUNK_ALIGN, RANGES, plan
from muser.env import EnvError, read


def _weights():
    # o, gate|up, down of a small layer: 64 KB, 256 KB, 128 KB of bf16
    return [torch.empty(n, dtype=torch.bfloat16) for n in (32 << 10, 128 << 10, 64 << 10)]


@pytest.mark.parametrize("budget, taken", [
    (16 << 10, (16 << 10, 0, 0)),                    # inside the first range
    (64 << 10, (64 << 10, 0, 0)),                    # the first range exactly
    (100 << 10, (64 << 10, 36 << 10, 0)),            # into the second
    (1 << 20, (64 << 10, 256 << 10, 128 << 10)),     # past the end: all three whole
])
def test_the_budget_takes_the_ranges_in_the_order_the_step_reads_them(budget, taken):
    ws = _weights()
    pf = plan(ws, budget, programs=4, lanes=128)
    assert tuple(n for _, n in pf.ranges) == taken
    assert [a for a, n in pf.ranges if n] == [w.data_ptr() for w, n in zip(ws, taken) if n]


@pytest.mark.parametrize("budget, programs, lanes", [(1000, 1, 32), (100 << 10, 4, 128),
                                                     (1 << 20, 32, 256), (48, 128, 128)])
def test_every_byte_taken_lies_in_some_lane_and_chunks_stay_aligned(budget, programs, lanes):
    pf = plan(_weights(), budget, programs, lanes)
    total = sum(n for _, n in pf.ranges)
    assert total == min(budget, 448 << 10) // CHUNK_ALIGN * CHUNK_ALIGN
    assert pf.chunk % CHUNK_ALIGN == 0 and pf.chunk * programs * lanes >= total
    assert all(a % CHUNK_ALIGN == 0 and n % CHUNK_ALIGN == 0 for a, n in pf.ranges)
    assert len(pf.args()) == 2 * RANGES + 1


def test_no_budget_or_no_bytes_is_no_prefetch():
    assert plan(_weights(), 0, 32, 128) is None
    assert plan(_weights(), 8, 32, 128) is None            # under one 16-byte unit
    assert plan([], 1 << 20, 32, 128) is None


def test_a_strided_range_or_a_fourth_range_is_refused_by_name():
    w = torch.empty(64, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="contiguous"):
        plan([w.t()], 1 << 20, 32, 128)
    with pytest.raises(ValueError, match=f"at most {RANGES} prefetch ranges; found 4"):
        plan(_weights() + [w], 1 << 20, 32, 128)


def test_the_knob_parses_and_refuses_what_it_does_not_name():
    assert read({"MUSER_PREFETCH": "16"}).prefetch == "16"
    assert read({}).prefetch == "auto"
    with pytest.raises(EnvError, match="MUSER_PREFETCH"):
        read({"MUSER_PREFETCH": "7"})


def test_a_launch_without_a_prefetch_passes_zeros_and_no_constexprs():
    from muser.backends.cuda.l2_prefetch import launch_args
    assert launch_args(None) == ([0] * (2 * RANGES + 1), {})
    pf = plan(_weights(), 1 << 20, 8, 64)
    args, consts = launch_args(pf)
    assert args == pf.args() and len(args) == 2 * RANGES + 1
    assert consts == dict(NPF=8, PF_LANES=64)


def test_layers_whose_weights_are_not_plain_tensors_ask_for_nothing():
    from types import SimpleNamespace

    from muser.backends.cuda.l2_prefetch import PROGRAMS, plans
    w = _weights()
    int8_rows = SimpleNamespace(q=w[0], scale=None)          # not a tensor: its bytes lie elsewhere
    out = plans([w, None, [w[0], int8_rows], [w[1].view(256, 512).t()], [w[2]]], 1,
                [128, 128, 128, 128, 64])
    assert [p is not None for p in out] == [True, False, False, False, True]
    assert out[0].programs == PROGRAMS == 32
    assert out[4].lanes == 64 and out[4].ranges[0] == (w[2].data_ptr(), 128 << 10)


def _layer(moe=None):
    from types import SimpleNamespace
    o, gu, down = (torch.empty(n, dtype=torch.bfloat16)
                   for n in (3 << 20, 8 << 20, 4 << 20))                  # 6, 16, 8 MB
    return SimpleNamespace(wo=o, w_down=down, moe=moe), {"wgu": gu}


@pytest.mark.parametrize("knobs, attn_mb", [
    ({}, 8),                                                      # auto: 8 MB from the attention
    ({"MUSER_PREFETCH": "off"}, None),
    ({"MUSER_PREFETCH": "16"}, 16),
])
def test_a_decode_step_asks_the_attention_launch_for_its_bytes(knobs, attn_mb):
    from muser.backends.cuda.l2_prefetch import step_plans
    (l0, f0), (l1, f1), (l2, f2) = _layer(), _layer(moe=object()), _layer()
    attn = step_plans([l0, l1, l2], [f0, f1, f2], [{"warps": 4}] * 3, read(knobs))

    def mb(p):
        return None if p is None else sum(n for _, n in p.ranges) >> 20
    assert [mb(p) for p in attn] == [attn_mb, None, attn_mb]      # the MoE layer asks nothing
    if attn_mb:                       # o whole (6 MB), then gate|up from its start
        assert attn[0].ranges[:2] == ((l0.wo.data_ptr(), 6 << 20),
                                      (f0["wgu"].data_ptr(), (attn_mb - 6) << 20))
        assert attn[0].lanes == 128 and attn[0].programs == 32
