"""The prompt graphs' host side on the CPU (backends/cuda/prompt_graph.py, capture off): which
passes they take, the bucket's padding rows kept out of the planes, the chunk's rows stored
through `Plane.store` after attending, the logits rows asked for, and the session afterwards
exactly as the eager chunk pass leaves it.  The kernels are test_chunk_step_host's plain-torch
stand-ins (the bits on real kernels: tests/cuda/test_prompt_graph.py)."""
import pytest
import torch
from test_chunk_step_host import IDS, FakeStep, fake_attention, fake_prepare

from muser.backends.cuda import chunk_step, triton_chunk, triton_decode
from muser.backends.cuda.prompt_graph import PromptGraphs, bucket_for
from muser.backends.step import forward as one_forward
from muser.testing import tiny_model


class Step(FakeStep):
    def __init__(self, engine):
        super().__init__(engine)
        self.engine = engine

    def layers(self, ids, attend):
        if self.pos is None or self.pos.shape[0] != ids.shape[0]:
            self.pos = torch.arange(ids.shape[0])        # a prompt pass: positions 0.. of the bucket
        # the fake keeps every layer's output to the end; the real step consumes each at once
        # (the prompt pass reuses one output buffer for every layer)
        return super().layers(ids, lambda *a: attend(*a).clone())


def fake_prepare_into(qkv, pos, cos, sin, qn, kn, eps, heads, kv, d, nsplit, interleaved, q, k, v,
                      table, meta, **kw):
    for dst, src in zip((q, k, v), fake_prepare(qkv, pos, cos, sin, qn, kn, eps, heads, kv, d,
                                                nsplit, interleaved)):
        dst.copy_(src)


@pytest.fixture
def engine(monkeypatch):
    monkeypatch.setattr(chunk_step, "prepare_rows", fake_prepare)
    monkeypatch.setattr(chunk_step, "chunk_attention", fake_attention)
    monkeypatch.setattr(triton_decode, "prepare_rows_into", fake_prepare_into)
    monkeypatch.setattr(triton_chunk, "chunk_attention", fake_attention)
    return tiny_model("gemma3", window=4, tokenizer=False, max_context=256)


def passes(engine, step, prompts):
    def through(eng, ss, cs, al, pad, logits=True):
        step.pos = torch.cat([torch.arange(s.position, s.position + len(c)) for s, c in zip(ss, cs)])
        return chunk_step.chunk_pass(step, eng, ss, cs, al, pad, logits, prompts)
    return through


@pytest.mark.parametrize("n", [1, 4, 5, 14])
def test_a_first_chunk_leaves_the_session_as_the_eager_pass_does(engine, n):
    step = Step(engine)
    prompts = PromptGraphs(step, [p.window for p in engine.new_session().planes], capture=False)
    a, b = engine.new_session(), engine.new_session()
    la = one_forward(engine, [a], [IDS[:n]], True, False, pass_fn=passes(engine, step, prompts))
    assert prompts.stats["eager"] == 1 and list(prompts.buckets) == [bucket_for(n)]
    lb = one_forward(engine, [b], [IDS[:n]], True, False, pass_fn=passes(engine, step, None))
    assert la.shape == lb.shape and torch.allclose(la, lb, atol=1e-5)
    for pa, pb in zip(a.planes, b.planes):
        assert (pa.len, pa.end, pa.origin_physical) == (pb.len, pb.end, pb.origin_physical)
        assert all(torch.equal(x, y) for x, y in zip(pa.logical_rows(), pb.logical_rows()))
    a.check_invariants()
    assert a.tokens == IDS[:n] and a.position == n
    rest = [5, 6, 7]
    xa = one_forward(engine, [a], [rest], False, False, pass_fn=passes(engine, step, prompts))
    xb = one_forward(engine, [b], [rest], False, False, pass_fn=passes(engine, step, None))
    assert torch.allclose(xa, xb, atol=1e-5) and prompts.stats["eager"] == 1


def test_a_failure_after_the_pass_leaves_the_session_empty(engine, monkeypatch):
    """The stores run inside the one forward's transaction: a fault in a late layer's store
    rolls back the earlier layers' rows too."""
    step = Step(engine)
    prompts = PromptGraphs(step, [p.window for p in engine.new_session().planes], capture=False)
    s = engine.new_session()
    last = s.planes[-1]

    def broken(*a, **k):
        raise RuntimeError("injected store fault")
    monkeypatch.setattr(last, "store", broken)
    with pytest.raises(RuntimeError, match="injected"):
        one_forward(engine, [s], [IDS[:6]], True, False, pass_fn=passes(engine, step, prompts))
    assert s.position == 0 and all(p.len == 0 for p in s.planes)
    s.check_invariants()
