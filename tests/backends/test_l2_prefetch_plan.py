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


def test_the_knobs_parse_and_refuse_what_they_do_not_name():
    env = read({"MUSER_PREFETCH": "16", "MUSER_PREFETCH_PROGRAMS": "64",
                "MUSER_PREFETCH_AT": "early"})
    assert (env.prefetch, env.prefetch_programs, env.prefetch_at) == ("16", "64", "early")
    assert read({}).prefetch == "auto"
    with pytest.raises(EnvError, match="MUSER_PREFETCH"):
        read({"MUSER_PREFETCH": "7"})


def test_a_launch_without_a_prefetch_passes_zeros_and_no_constexprs():
    from muser.backends.cuda.l2_prefetch import launch_args
    assert launch_args(None) == ([0] * (2 * RANGES + 1), {})
    pf = plan(_weights(), 1 << 20, 8, 64, early=True, last=True)
    args, consts = launch_args(pf)
    assert args == pf.args() and len(args) == 2 * RANGES + 1
    assert consts == dict(NPF=8, PF_EARLY=True, PF_LANES=64, PF_LAST=True)


def test_layers_whose_weights_are_not_plain_tensors_ask_for_nothing():
    from types import SimpleNamespace

    from muser.backends.cuda.l2_prefetch import plans
    env = read({"MUSER_PREFETCH_PROGRAMS": "16", "MUSER_PREFETCH_HINT": "last"})
    w = _weights()
    int8_rows = SimpleNamespace(q=w[0], scale=None)          # not a tensor: its bytes lie elsewhere
    out = plans([w, None, [w[0], int8_rows], [w[1].view(256, 512).t()], [w[2]]], 1,
                [128, 128, 128, 128, 64], env)
    assert [p is not None for p in out] == [True, False, False, False, True]
    assert out[0].programs == 16 and out[0].last and not out[0].early
    assert out[4].lanes == 64 and out[4].ranges[0] == (w[2].data_ptr(), 128 << 10)


@pytest.mark.parametrize("skip, first, sizes", [
    (0, 0, [64 << 10, 256 << 10, 128 << 10]),          # nothing asked before: all of it
    (16 << 10, 0, [48 << 10, 256 << 10, 128 << 10]),    # inside the first tensor
    (64 << 10, 1, [256 << 10, 128 << 10]),              # the first tensor exactly
    (100 << 10, 1, [220 << 10, 128 << 10]),             # into the second
    (1 << 20, None, []),                                # past the end: nothing left
])
def test_what_a_later_launch_asks_for_starts_where_the_earlier_one_stopped(skip, first, sizes):
    from muser.backends.cuda.l2_prefetch import after
    ws = _weights()
    rest = after(ws, skip)
    assert [t.numel() * t.element_size() for t in rest] == sizes
    if rest:
        start = ws[first].data_ptr() + (skip - sum(w.numel() * 2 for w in ws[:first]))
        assert rest[0].data_ptr() == start and all(t.is_contiguous() for t in rest)
    assert after([ws[0].view(256, 128).t()], 0) is None


def _layer(moe=None):
    from types import SimpleNamespace
    o, gu, down, qkv = (torch.empty(n, dtype=torch.bfloat16)
                        for n in (3 << 20, 8 << 20, 4 << 20, 2 << 20))    # 6, 16, 8, 4 MB
    return SimpleNamespace(wo=o, w_down=down, moe=moe), {"wgu": gu, "wqkv": qkv}


@pytest.mark.parametrize("knobs, attn_mb, more_mb, qkv_mb", [
    ({}, 8, None, None),                                          # auto: 8 MB from the attention
    ({"MUSER_PREFETCH": "off"}, None, None, None),
    ({"MUSER_PREFETCH": "16", "MUSER_PREFETCH_MLP": "on"}, 16, 8, None),
    ({"MUSER_PREFETCH_QKV": "on", "MUSER_PREFETCH_MLP": "on"}, 8, 8, 4),
])
def test_a_decode_step_asks_each_site_for_its_own_bytes(knobs, attn_mb, more_mb, qkv_mb):
    from muser.backends.cuda.l2_prefetch import step_plans
    (l0, f0), (l1, f1), (l2, f2) = _layer(), _layer(moe=object()), _layer()
    env = read(knobs)
    attn, more, qkv = step_plans([l0, l1, l2], [f0, f1, f2], [{"warps": 4}] * 3, env)

    def mb(p):
        return None if p is None else sum(n for _, n in p.ranges) >> 20
    assert [mb(p) for p in attn] == [attn_mb, None, attn_mb]      # the MoE layer asks nothing
    assert [mb(p) for p in more] == [more_mb, None, more_mb]
    assert [mb(p) for p in qkv] == [qkv_mb, qkv_mb, None]         # layer i asks for i + 1's
    if attn_mb:                       # o whole (6 MB), then gate|up from its start
        assert attn[0].ranges[:2] == ((l0.wo.data_ptr(), 6 << 20),
                                      (f0["wgu"].data_ptr(), (attn_mb - 6) << 20))
        assert attn[0].lanes == 128
    if more_mb:                       # where the attention's budget stopped in gate|up
        assert more[0].ranges[0][0] == f0["wgu"].data_ptr() + ((attn_mb - 6) << 20)
    if qkv_mb:
        assert qkv[0].ranges[0] == (f1["wqkv"].data_ptr(), 4 << 20)
