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

from muser.backends.cuda import chunk_graph, chunk_step, triton_chunk, triton_decode
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


PLANES = []            # the planes of the session in the pass (to read the tables back)
GRAPHS = []            # the ChunkGraphs of the pass (their buckets' shadows, by pointer)


def at(ptr: int, rows: int, rs: int, hs: int, kv: int, d: int) -> torch.Tensor:
    """The [rows, KV, D] view a device table row's pointer and strides name: found among the
    planes' and the buckets' tensors (what the kernels would address)."""
    tensors = [t for p in PLANES for t in (p.keys, p.values)]
    tensors += [t for g in GRAPHS for b in g.buckets.values() for t in b.sk + b.sv if t is not None]
    for t in tensors:
        base, size = t.data_ptr(), t.numel() * t.element_size()
        if base <= ptr < base + size:
            off = t.storage_offset() + (ptr - base) // t.element_size()
            return torch.as_strided(t, (rows, kv, d), (rs, hs, 1), off)
    raise AssertionError(f"no tensor at {ptr:#x}")


def fake_place_rows(k, v, tab, meta):
    """triton_graph_rows.place_rows in plain torch: rows [0, R) past the plane's end."""
    kp, vp, rs, hs = tab.tolist()
    start, R, first = meta.tolist()[:3]
    for ptr, src in ((kp, k), (vp, v)):
        at(ptr + (start - first) * rs * src.element_size(), R, rs, hs, *src.shape[1:]).copy_(src[:R])


def fake_fill_shadow(tab, meta, dk, dv, cap):
    """triton_graph_rows.fill_shadow in plain torch: the ring from slot s0 on, in order."""
    kp, vp, rs, hs = tab.tolist()
    slots = (meta[3].item() + torch.arange(cap)) % cap
    for ptr, dst in ((kp, dk), (vp, dv)):
        dst[:cap].copy_(at(ptr, cap, rs, hs, *dst.shape[1:])[slots])


def fake_graph_attention(q, keys, values, start, first, window, scale, softcap, interleaved, lay,
                         sinks=None, ring=None, block_m=None, out=None, warps=None, new=None,
                         kcount=None, dev=None, positions=None):
    """The reference attention over what the device tables say: key rows from the view the
    table row points at, by (first, rot, capacity, count) -- a plane, or a ring's shadow --
    then, apart (`new`), the chunk's own rows."""
    if dev is None:
        return fake_attention(q, keys, values, start, first, window, scale, softcap, interleaved,
                              lay, sinks, ring, block_m, out, warps)
    tab, meta = dev
    start, R, first, rot, capm, count = meta.tolist()
    if new is None:                      # staged: one ordered view, `count` rows from `first`
        kp, vp, rs, hs = tab.tolist()
        KV, D = keys.shape[1:]
        k, v = at(kp, count, rs, hs, KV, D), at(vp, count, rs, hs, KV, D)
        kpos = torch.arange(first, first + count)
        qpos = torch.arange(start, start + R)
        res = reference(q[:R].float(), k.float(), v.float(), visibility_mask(qpos, kpos, window),
                        scale, None)
        out[:R] = res.to(out.dtype)
        return out
    plane = next(p for p in PLANES if p.keys.data_ptr() == int(tab[0]))   # (storage as reserved)
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
    monkeypatch.setattr(chunk_graph, "place_rows", fake_place_rows)
    monkeypatch.setattr(chunk_graph, "fill_shadow", fake_fill_shadow)
    return tiny_model("gemma3", window=4, tokenizer=False, max_context=256)


def passes(engine, step, graphs):
    def through(eng, ss, cs, al, pad, logits=True):
        step.pos = torch.cat([torch.arange(s.position, s.position + len(c)) for s, c in zip(ss, cs)])
        PLANES[:] = [p for s in ss for p in s.planes]
        GRAPHS[:] = [graphs] if graphs is not None else []
        return chunk_step.chunk_pass(step, eng, ss, cs, al, pad, logits, graphs)
    return through


@pytest.mark.parametrize("staged", [True, False])
@pytest.mark.parametrize("cuts", [[14], [5, 9], [1, 1, 1, 11], [3, 1, 4, 1, 5], [2, 12]])
def test_chunks_through_graphs_leave_the_session_as_the_eager_pass_does(engine, cuts, staged):
    """Every chunk of a session through a graph pass (the history read through the uploaded
    tables; rings of 4 wrap), against the same chunks through the eager pass -- with the keys
    staged (growing planes' rows placed past their end, rings' history in a shadow) or apart."""
    step = Step(engine)
    graphs = ChunkGraphs(step, [p.window for p in engine.new_session().planes], capture=False,
                         staged=staged)
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


def same_as_eager(engine, step, graphs, sizes):
    """Chunks of `sizes` through `graphs` and through the eager pass, two sessions: the same
    logits chunk by chunk, then the same tokens and every plane's rows."""
    a, b = engine.new_session(), engine.new_session()
    for c in sizes:
        ids = [(7 * (a.position + j)) % 300 + 3 for j in range(c)]
        la = one_forward(engine, [a], [ids], True, False, pass_fn=passes(engine, step, graphs))
        lb = one_forward(engine, [b], [ids], True, False, pass_fn=passes(engine, step, None))
        assert torch.allclose(la, lb, atol=1e-5)
    assert a.tokens == b.tokens and a.position == b.position == sum(sizes)
    for pa, pb in zip(a.planes, b.planes):
        assert all(torch.equal(x, y) for x, y in zip(pa.logical_rows(), pb.logical_rows()))


def test_a_bucket_without_room_goes_eager_and_the_shorter_ones_keep_their_graphs(engine,
                                                                                 monkeypatch):
    """The GPU has no memory for a bucket's buffers: that chunk runs eagerly (the same result,
    nothing stored twice), that bucket and every longer one stay eager, the shorter ones keep
    taking graphs, and the step no longer counts a dropped long bucket as graphed."""
    step = Step(engine)
    graphs = ChunkGraphs(step, [p.window for p in engine.new_session().planes], capture=False,
                         max_rows=16384)
    assert graphs.limit == 16384 and 16384 in step.graph_rows
    real = chunk_graph._Bucket

    def tight(step_, rows, *a):
        if rows > 16:
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return real(step_, rows, *a)
    monkeypatch.setattr(chunk_graph, "_Bucket", tight)
    same_as_eager(engine, step, graphs, (20, 12, 30, 16))
    assert graphs.stats["no_room"] == 1 and graphs.limit == 16 and not step.graph_rows
    assert sorted(graphs.buckets) == [16] and graphs.stats["eager"] == 2 and not graphs.failed


def test_a_capture_without_room_drops_that_bucket_and_the_longer_ones(engine, monkeypatch):
    """An OutOfMemoryError while capturing a bucket (its warm-up or its graph pool): that
    chunk runs eagerly, the bucket and every longer one stay eager, the chunk graphs are not
    marked failed, and a shorter bucket is still captured and replayed.  The CUDA graph is a
    stand-in that reruns the pass on replay (capture.py's contract: the output in place)."""
    from muser.backends.cuda import capture as cuda_capture

    class Graph:
        def __init__(self, fn, out):
            self.fn, self.out = fn, out

        def replay(self):
            self.out.copy_(self.fn())

    class Event:
        def record(self):
            pass

        def synchronize(self):
            pass

    first = [True]                              # the first capture runs out of memory

    def capture(fn, pool):
        if first:
            first.clear()
            raise torch.OutOfMemoryError("CUDA out of memory (injected at the capture)")
        out = fn()
        return Graph(fn, out), out
    monkeypatch.setattr(cuda_capture, "capture", capture)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: object())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    step = Step(engine)
    graphs = ChunkGraphs(step, [p.window for p in engine.new_session().planes], capture=True,
                         max_rows=16384)
    same_as_eager(engine, step, graphs, (20, 12, 30, 16))
    assert graphs.stats == {"captures": 1, "replays": 2, "eager": 0, "no_room": 1}
    assert graphs.limit == 16 and sorted(graphs.buckets) == [16] and not graphs.failed


@pytest.mark.parametrize("chunk, start, rows", [
    ([7], 0, 2), ([5, 6, 7], 10, 4), (list(range(3, 19)), 100, 16), (list(range(2049)), 5, 3072),
])
def test_the_upload_holds_ids_padding_and_positions_at_the_last_real_one(chunk, start, rows):
    tables = [11, 12, 13, 14, 15, 16]
    host = torch.full((2 * rows + len(tables),), -1, dtype=torch.int64)
    chunk_graph.fill_host(host, chunk, start, rows, tables)
    R = len(chunk)
    assert host[:rows].tolist() == chunk + [0] * (rows - R)
    assert host[rows:2 * rows].tolist() == [min(start + r, start + R - 1) for r in range(rows)]
    assert host[2 * rows:].tolist() == tables


@pytest.mark.parametrize("rows", [2, 64, 2048])
def test_a_buckets_size_estimate_is_what_it_allocates(engine, rows):
    step = Step(engine)
    shadows = [c > 0 for c in step.caps]
    b = chunk_graph._Bucket(step, rows, "cpu", shadows)
    held = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
            for t in [*b.k, *b.v, *b.q, *b.out, *(x for x in b.sk + b.sv if x is not None)]}
    assert chunk_graph.bucket_bytes(step, rows) == sum(held.values())


def test_auto_buckets_stop_at_the_chunk_and_at_a_64th_of_the_memory(engine):
    step = Step(engine)
    one = chunk_graph.bucket_bytes(step, 4096)
    assert chunk_graph.auto_limit(step, 16384, 0) == 2048
    assert chunk_graph.auto_limit(step, 16384, 1 << 40) == 16384
    assert chunk_graph.auto_limit(step, 8192, 1 << 40) == 8192
    assert chunk_graph.auto_limit(step, 512, 1 << 40) == 2048
    assert chunk_graph.auto_limit(step, 16384, 64 * one) == 4096
