"""CUDA's exact chunk pass, host side, on the CPU (backends/cuda/chunk_step.py): per layer and
session the rows of a pass go through `stage` (every route: in place, shadow, ring decode) and
commit after attention; sessions' rows are cut at the right offsets; positions are absolute;
the logits rows kept are each session's last (or all); a failure inside the pass leaves every
session as it was (the one forward's transaction).  The kernels are replaced by plain torch:
`prepare_rows` splits qkv, `chunk_attention` is the reference attention over the staged view's
key positions -- so a pass must equal attending over the whole history directly."""
import pytest
import torch

from muser.attention.reference import attention as reference
from muser.attention.reference import visibility_mask
from muser.backends.cuda import chunk_step
from muser.backends.step import forward as one_forward
from muser.testing import tiny_model

WINDOW = 4


def qkv_of(ids: torch.Tensor, pos: torch.Tensor, layer: int, width: int) -> torch.Tensor:
    """A layer's qkv rows as a function of (token, position, layer) only."""
    g = torch.Generator().manual_seed(layer)
    table = torch.randn(512, width, generator=g)
    return table[ids] + 0.01 * pos[:, None].float() + layer


class FakeStep:
    """Stands in for DecodeStep: `layers` hands each layer a qkv and keeps what attention gives."""

    def __init__(self, engine):
        s = engine.spec
        self.spec, L = s, len(s.layers)
        self.rope = [(None, None)] * L
        self.lays = [{} for _ in range(L)]
        self.caps = [0] * L
        self.splits = [1] * L
        self.width = (s.num_heads + 2 * s.num_kv_heads) * s.head_dim
        self.pos = None

    def layers(self, ids, attend):
        outs = []
        for i, ls in enumerate(self.spec.layers):
            lw = type("W", (), {"wv": object(), "sinks": None})()
            a = attend(i, lw, ls, qkv_of(ids, self.pos, i, self.width), None, None)
            outs.append(a.flatten(1))
        return torch.cat(outs, 1)                       # [R, L * H * D]: every layer's attention

    def head(self, x):
        return x.float()


def fake_prepare(qkv, pos, cos, sin, qn, kn, eps, heads, kv, d, nsplit, interleaved, **kw):
    R = qkv.shape[0]
    q = qkv[:, :heads * d].reshape(R, heads, d)
    k = qkv[:, heads * d:(heads + kv) * d].reshape(R, kv, d)
    v = qkv[:, (heads + kv) * d:].reshape(R, kv, d)
    return q.contiguous(), k.contiguous(), v.contiguous()


CALLS = []


def fake_attention(q, keys, values, start, first, window, scale, softcap, interleaved, lay,
                   sinks=None, ring=None, block_m=None, out=None, warps=None):
    S = keys.shape[0]
    if ring is None:
        kpos = torch.arange(first, first + S)
    else:                                               # slot j holds first + (j - rot) mod capacity
        rot, cap = ring
        kpos = first + (torch.arange(S) - rot) % cap
    CALLS.append(("ring" if ring else "ordered", q.shape[0]))
    qpos = torch.arange(start, start + q.shape[0])
    res = reference(q.float(), keys.float(), values.float(), visibility_mask(qpos, kpos, window), scale, None)
    out.copy_(res.to(out.dtype))
    return out


@pytest.fixture
def patched(monkeypatch):
    monkeypatch.setattr(chunk_step, "prepare_rows", fake_prepare)
    monkeypatch.setattr(chunk_step, "chunk_attention", fake_attention)
    CALLS.clear()


@pytest.fixture
def engine():
    return tiny_model("gemma3", window=WINDOW, tokenizer=False, max_context=256)


def run(engine, step, sessions, chunks, all_logits=True):
    def pass_fn(eng, ss, cs, al, pad, logits=True):
        starts = [s.position for s in ss]
        step.pos = torch.cat([torch.arange(st, st + len(c)) for st, c in zip(starts, cs)])
        return chunk_step.chunk_pass(step, eng, ss, cs, al, pad, logits)
    return one_forward(engine, sessions, chunks, all_logits, pad=True, pass_fn=pass_fn)


def truth(engine, step, ids):
    """Every layer's attention for ids at positions 0.. over the whole history, directly."""
    spec = engine.spec
    pos = torch.arange(len(ids))
    t = torch.tensor(ids)
    outs = []
    for i, ls in enumerate(spec.layers):
        q, k, v = fake_prepare(qkv_of(t, pos, i, step.width), pos, None, None, None, None, 0.0,
                               spec.num_heads, ls.kv_heads, ls.head_dim, 1, False)
        mask = visibility_mask(pos, pos, ls.window)
        outs.append(reference(q, k, v, mask, spec.layer_scale(ls), None).flatten(1))
    return torch.cat(outs, 1)


IDS = [7, 3, 99, 41, 5, 5, 18, 200, 11, 64, 3, 9, 120, 77]


@pytest.mark.parametrize("cuts", [[14], [5, 9], [1, 1, 1, 11], [3, 1, 4, 1, 5]])
def test_a_pass_attends_as_the_whole_history_does(patched, engine, cuts):
    step = FakeStep(engine)
    s, at, rows = engine.new_session(), 0, []
    for c in cuts:
        rows.append(run(engine, step, [s], [IDS[at:at + c]]))
        at += c
    want = truth(engine, step, IDS)
    assert torch.allclose(torch.cat(rows), want.to(engine.dtype).float(), atol=1e-5)
    assert s.position == len(IDS) and s.tokens == IDS
    s.check_invariants()
    if cuts == [3, 1, 4, 1, 5]:      # a one-row chunk on a full ring: the ring read in place
        assert ("ring", 1) in CALLS


def test_sessions_share_a_pass_at_their_own_offsets_and_positions(patched, engine):
    step = FakeStep(engine)
    a, b, c = engine.new_session(), engine.new_session(), engine.new_session()
    run(engine, step, [a], [IDS[:6]])
    run(engine, step, [b], [IDS[:2]])
    together = run(engine, step, [a, b, c], [IDS[6:9], IDS[2:7], IDS[:1]], all_logits=True)
    last = run(engine, step, [a, b], [IDS[9:10], IDS[7:8]], all_logits=False)
    want = truth(engine, step, IDS)
    w = want.to(engine.dtype).float()
    assert torch.allclose(together[:3], w[6:9], atol=1e-5)
    assert torch.allclose(together[3:8], w[2:7], atol=1e-5)
    assert torch.allclose(together[8:], w[:1], atol=1e-5)
    assert last.shape[0] == 2                          # each session's last row
    assert torch.allclose(last[0], w[9], atol=1e-5) and torch.allclose(last[1], w[7], atol=1e-5)
    for s in (a, b, c):
        s.check_invariants()


def test_a_failure_inside_the_pass_leaves_every_session_as_it_was(patched, engine, monkeypatch):
    step = FakeStep(engine)
    a, b = engine.new_session(), engine.new_session()
    run(engine, step, [a], [IDS[:6]])
    run(engine, step, [b], [IDS[:3]])
    before = [s.snapshot() for s in (a, b)]
    calls = {"n": 0}

    def fail_late(*args, **kw):
        calls["n"] += 1
        if calls["n"] == 2 * len(engine.spec.layers) - 1:         # the last layer, first session
            raise RuntimeError("injected kernel fault")
        return fake_attention(*args, **kw)
    monkeypatch.setattr(chunk_step, "chunk_attention", fail_late)
    with pytest.raises(RuntimeError, match="injected"):
        run(engine, step, [a, b], [IDS[6:11], IDS[3:5]])
    for s, snap in zip((a, b), before):
        assert s.snapshot().equal(snap)
        s.check_invariants()
