"""The chunk graphs' host side on the CPU (backends/cuda/chunk_graph.py, capture off): the
bucket's padding rows kept out of the planes, the chunk's rows stored through `Plane.store`
after attending, the logits rows asked for, a failure rolled back, and the session afterwards
exactly as the eager chunk pass leaves it.  The kernels are stand-ins: test_chunk_step_host's
plain-torch q/k/v, and an attention that reads the history as the device tables say (the plane
table row, origins, capacity) and the chunk's own rows from the bucket -- so the tables the
runner uploads are checked too (the bits on real kernels: tests/cuda/test_chunk_graph.py)."""
import pytest
import torch
from test_chunk_step_host import IDS, FakeStep, fake_attention, fake_prepare

from muser.attention.reference import attention as reference
from muser.attention.reference import visibility_mask

from muser.backends.cuda import chunk_step, triton_chunk, triton_decode
from muser.backends.cuda.chunk_graph import ChunkGraphs, bucket_for
from muser.backends.step import forward as one_forward
from muser.testing import tiny_model


class Step(FakeStep):
    def __init__(self, engine):
        super().__init__(engine)
        self.engine = engine
        self.caps = [p.capacity if p.kind == "ring" else 0 for p in engine.new_session().planes]

    def layers(self, ids, attend):
        # a bucket's padding rows take the last real position (what chunk_graph uploads)
        pad = ids.shape[0] - self.pos.shape[0]
        if pad > 0:
            self.pos = torch.cat([self.pos, self.pos[-1:].repeat(pad)])
        # the fake keeps every layer's output to the end; the real step consumes each at once
        # (a graph pass reuses one output buffer for every layer)
        return super().layers(ids, lambda *a: attend(*a).clone())


def fake_prepare_into(qkv, pos, cos, sin, qn, kn, eps, heads, kv, d, nsplit, interleaved, q, k, v,
                      table, meta, **kw):
    for dst, src in zip((q, k, v), fake_prepare(qkv, pos, cos, sin, qn, kn, eps, heads, kv, d,
                                                nsplit, interleaved)):
        dst.copy_(src)


PLANES = {}            # data_ptr -> plane of the session in the pass (to read the tables back)


def fake_graph_attention(q, keys, values, start, first, window, scale, softcap, interleaved, lay,
                         sinks=None, ring=None, block_m=None, out=None, warps=None, new=None,
                         kcount=None, dev=None, positions=None):
    """The reference attention over what the device tables say: history rows from the plane
    the table row points at, by (first, rot, capacity, count), then the chunk's own rows."""
    if dev is None:
        return fake_attention(q, keys, values, start, first, window, scale, softcap, interleaved,
                              lay, sinks, ring, block_m, out, warps)
    tab, meta = dev
    start, R, first, rot, capm, count = meta.tolist()
    plane = PLANES[int(tab[0])]
    assert int(tab[1]) == plane.values.data_ptr() and (ring is not None) == (capm > 0)
    hpos = torch.arange(first, first + count)
    slots = (rot + hpos - first) % capm if capm else hpos - first
    hk = plane.keys[:, slots].transpose(0, 1) if plane.head_major else plane.keys[slots]
    hv = plane.values[:, slots].transpose(0, 1) if plane.head_major else plane.values[slots]
    k = torch.cat([hk, new[0][:R]])
    v = torch.cat([hv, new[1][:R]])
    kpos = torch.cat([hpos, torch.arange(start, start + R)])
    qpos = torch.arange(start, start + R)
    res = reference(q[:R].float(), k.float(), v.float(), visibility_mask(qpos, kpos, window),
                    scale, None)
    out[:R] = res.to(out.dtype)
    return out


@pytest.fixture
def engine(monkeypatch):
    monkeypatch.setattr(chunk_step, "prepare_rows", fake_prepare)
    monkeypatch.setattr(chunk_step, "chunk_attention", fake_attention)
    monkeypatch.setattr(triton_decode, "prepare_rows_into", fake_prepare_into)
    monkeypatch.setattr(triton_chunk, "chunk_attention", fake_graph_attention)
    return tiny_model("gemma3", window=4, tokenizer=False, max_context=256)


def passes(engine, step, graphs):
    def through(eng, ss, cs, al, pad, logits=True):
        step.pos = torch.cat([torch.arange(s.position, s.position + len(c)) for s, c in zip(ss, cs)])
        PLANES.clear()
        PLANES.update({p.keys.data_ptr(): p for s in ss for p in s.planes})
        return chunk_step.chunk_pass(step, eng, ss, cs, al, pad, logits, graphs)
    return through


@pytest.mark.parametrize("cuts", [[14], [5, 9], [1, 1, 1, 11], [3, 1, 4, 1, 5], [2, 12]])
def test_chunks_through_graphs_leave_the_session_as_the_eager_pass_does(engine, cuts):
    """Every chunk of a session through a graph pass (the history read through the uploaded
    tables; rings of 4 wrap), against the same chunks through the eager pass."""
    step = Step(engine)
    graphs = ChunkGraphs(step, [p.window for p in engine.new_session().planes], capture=False)
    a, b, at = engine.new_session(), engine.new_session(), 0
    for n, c in enumerate(cuts):
        la = one_forward(engine, [a], [IDS[at:at + c]], True, False, pass_fn=passes(engine, step, graphs))
        assert graphs.stats["eager"] == n + 1 and bucket_for(c) in graphs.buckets
        lb = one_forward(engine, [b], [IDS[at:at + c]], True, False, pass_fn=passes(engine, step, None))
        assert la.shape == lb.shape and torch.allclose(la, lb, atol=1e-5)
        for pa, pb in zip(a.planes, b.planes):
            assert (pa.len, pa.end, pa.origin_physical) == (pb.len, pb.end, pb.origin_physical)
            assert all(torch.equal(x, y) for x, y in zip(pa.logical_rows(), pb.logical_rows()))
        a.check_invariants()
        at += c
    assert a.tokens == IDS[:at] and a.position == at
    last = one_forward(engine, [a], [[5, 6, 7]], False, False, pass_fn=passes(engine, step, graphs))
    want = one_forward(engine, [b], [[5, 6, 7]], False, False, pass_fn=passes(engine, step, None))
    assert last.shape[0] == 1 and torch.allclose(last, want, atol=1e-5)


def test_a_failure_after_the_pass_leaves_the_session_as_it_was(engine, monkeypatch):
    """The stores run inside the one forward's transaction: a fault in a late layer's
    bookkeeping (after the earlier layers advanced and logged their evictions, before any row
    is written) leaves every plane's bookkeeping and rows as they were."""
    step = Step(engine)
    graphs = ChunkGraphs(step, [p.window for p in engine.new_session().planes], capture=False)
    s = engine.new_session()
    one_forward(engine, [s], [IDS[:6]], True, False, pass_fn=passes(engine, step, graphs))
    marks = [p.bookmark() for p in s.planes]
    rows = [p.logical_rows() for p in s.planes]
    last = s.planes[-1]

    def broken(*a, **k):
        raise RuntimeError("injected store fault")
    monkeypatch.setattr(last, "advance", broken)
    with pytest.raises(RuntimeError, match="injected"):
        one_forward(engine, [s], [IDS[6:12]], True, False, pass_fn=passes(engine, step, graphs))
    monkeypatch.undo()
    assert s.position == 6 and [p.bookmark() for p in s.planes] == marks
    for p, (k, v) in zip(s.planes, rows):
        got_k, got_v = p.logical_rows()
        assert torch.equal(got_k, k) and torch.equal(got_v, v)
    s.check_invariants()
