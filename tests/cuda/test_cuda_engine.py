"""The engine on CUDA end to end (tiny models, bfloat16): graph-captured decode agrees with the
chunk path and the float32 CPU oracle; the replay, rollback and pack contracts hold bitwise on
the GPU; batched decode; transactional steps; KV bytes match the plan."""
import pytest
import torch

from muser.backends.step import forward as one_forward
from muser.cache import CacheGeometry, plan
from muser.pack import format as pf
from muser.pack import reader as pr
from muser.testing import continue_both, prompt_ids as ids, tiny_model

from cudautil import needs_gpu, rel

pytestmark = needs_gpu
WINDOW = 4


@pytest.fixture(scope="module", params=["gemma3", "cohere2"])
def pair(request):
    arch = request.param
    return (tiny_model(arch, device="cuda", dtype="bfloat16", window=WINDOW, tokenizer=False),
            tiny_model(arch, window=WINDOW, tokenizer=False))


def test_graph_decode_equals_the_chunk_path_and_agrees_with_the_cpu_oracle(pair):
    """A decode step (graph replay) == the same token as a one-row chunk (chunk_step.py), bit
    for bit; and the eager chunk path (MUSER_CHUNKS=fast's) and the CPU oracle to rounding."""
    gpu, cpu = pair
    a, b, c, d = gpu.new_session(), gpu.new_session(), cpu.new_session(), gpu.new_session()
    prompt = ids(37, 1)
    for s in (a, b, c, d):
        s.prefill(prompt, chunk_size=8)
    for t in ids(40, 2):                       # wraps the ring many times; growing splits > 1
        la = a.decode(t)                       # graph replay
        lb = gpu.forward([b], [[t]], pad=True)[-1]                         # exact chunk
        ld = one_forward(gpu, [d], [[t]], all_logits=False, pad=False)[-1]   # eager chunk path
        lc = c.decode(t)
        assert torch.equal(la, lb)
        assert rel(la, ld) < 3e-2 and rel(la.cpu(), lc) < 5e-2
    runner = gpu.decode_runner()
    assert runner is not None and runner.stats["captures"] >= 1 and runner.stats["replays"] >= 40
    assert gpu.exact_rows
    a.check_invariants()


@pytest.mark.parametrize("position", [1, 3, 4, 5, 8, 11, 13])
def test_restore_replays_bitwise_on_gpu(pair, position):
    engine = pair[0]
    live = engine.new_session()
    live.prefill(ids(position, position), chunk_size=3)
    restored = engine.restore(live.snapshot())
    for a, b in zip(live.planes, restored.planes):
        assert a.metadata() == b.metadata()
    continue_both(live, restored)


def test_pack_round_trip_replays_bitwise_on_gpu(pair):
    engine = pair[0]
    live = engine.new_session()
    live.prefill(ids(11, 4), chunk_size=5)
    live.decode(3)
    again = engine.restore(pr.pack_from_bytes(pf.pack_to_bytes(live.snapshot())))
    continue_both(live, again)


@pytest.mark.parametrize("prefix, block, keep", [(2, 3, 1), (6, 5, 0), (9, 4, 4), (3, 9, 6), (10, 7, 2)])
def test_rollback_is_exact_on_gpu(pair, prefix, block, keep):
    engine = pair[0]
    pre, blk = ids(prefix, 5), ids(block, 6)
    a = engine.new_session()
    a.prefill(pre)
    cp = a.checkpoint(block)
    a.extend(blk)
    a.rollback(cp, keep)
    b = engine.new_session()
    b.prefill(pre)
    if keep:
        b.extend(blk[:keep])
    assert a.snapshot().equal(b.snapshot())
    continue_both(a, b)


def test_decode_inside_checkpoint_rolls_back_exactly(pair):
    engine = pair[0]
    a, b = engine.new_session(), engine.new_session()
    a.prefill(ids(9, 8))
    b.prefill(ids(9, 8))
    cp = a.checkpoint(3)
    for t in (4, 5, 6):
        a.decode(t)                             # graph steps logging ring evictions
    a.rollback(cp, 1)
    b.decode(4)
    assert a.snapshot().equal(b.snapshot())
    continue_both(a, b)


@pytest.mark.parametrize("batch", [1, 2, 3, 8, 16, 17])
def test_batched_decode_equals_each_session_alone(pair, batch):
    """One arithmetic per token on CUDA: a session's logits and K/V rows are bitwise the same
    decoded beside B-1 others as decoded alone -- through the ring wrap (WINDOW = 4)."""
    engine = pair[0]
    sessions = [engine.new_session() for _ in range(batch)]
    for i, s in enumerate(sessions):
        s.prefill(ids(3 + 5 * i, 10 + i))
    singles = [engine.restore(s.snapshot()) for s in sessions]
    for step in range(6):
        toks = [7 + step + i for i in range(batch)]
        rows = engine.decode_batch(sessions, toks)
        for row, s, t in zip(rows, singles, toks):
            assert torch.equal(row, s.decode(t))
    for s, t in zip(sessions, singles):
        assert s.position == t.position and s.tokens == t.tokens
        assert s.snapshot().equal(t.snapshot())
        s.check_invariants()


def test_failed_step_leaves_sessions_unchanged(pair, monkeypatch):
    engine = pair[0]
    sessions = [engine.new_session() for _ in range(2)]
    for s in sessions:
        s.prefill(ids(9, 3))
    before = [s.snapshot() for s in sessions]
    runner = engine.decode_runner()

    def boom(*a, **k):
        raise RuntimeError("injected fault")
    monkeypatch.setattr(runner, "_run", boom)
    with pytest.raises(RuntimeError):
        engine.decode_batch(sessions, [1, 2])
    monkeypatch.undo()
    for s, snap in zip(sessions, before):
        assert s.snapshot().equal(snap)
        s.check_invariants()
    import muser
    with pytest.raises(muser.RequestError):
        engine.decode_batch(sessions, [1, 10 ** 9])
    assert all(s.position == 9 for s in sessions)


def test_kv_bytes_match_the_plan(pair):
    engine = pair[0]
    spec = engine.spec
    s = engine.new_session()
    context = 100
    for p in s.planes:
        if p.kind == "growing":
            p.reserve(context)
    geo = CacheGeometry(tuple(l.window for l in spec.layers), spec.num_kv_heads, spec.head_dim,
                        2, engine.max_context)
    assert sum(p.allocated_bytes() for p in s.planes) == plan(geo, context).total_bytes
    assert all(p.keys.is_cuda for p in s.planes)


def test_default_prefill_chunk_on_cuda():
    """muser.load on CUDA prefills in 8k-16k-token chunks unless told otherwise (backends/defaults.py)."""
    import muser
    from muser.testing import tiny_model_dir
    engine = muser.load(str(tiny_model_dir("gemma3", tokenizer=False)), device="cuda", progress=False)
    assert engine.config.chunk_size in (8192, 16384)
    big = torch.cuda.get_device_properties(0).total_memory >= 64 << 30
    assert engine.config.chunk_size == (16384 if big else 8192)


@pytest.mark.parametrize("arch", ["gemma3", "cohere2"])
def test_a_long_chunk_through_tma_tiles_has_the_pointer_tiles_bits(arch, monkeypatch):
    """From 2,048 rows a chunk's projections take 128-row dot_rows tiles; with MUSER_DOT_TMA=on
    they load by TMA (eager at 2,300 rows, inside the 2,048-row chunk graph): the last logits and
    every K/V row are the bits of the pointer loads and of the prompt in chunks of 97."""
    kw = dict(device="cuda", dtype="bfloat16", window=WINDOW, tokenizer=False, max_context=4096,
              chunk_size=4096)
    monkeypatch.setenv("MUSER_DOT_TMA", "off")         # the pointer loads (auto: the default)
    base = tiny_model(arch, **kw)
    monkeypatch.setenv("MUSER_DOT_TMA", "on")
    tma = tiny_model(arch, **kw)
    p = ids(2300, 4)
    a, b, c, d = base.new_session(), tma.new_session(), tma.new_session(), tma.new_session()
    la, lb, lc = a.prefill(p), b.prefill(p), c.prefill(p, chunk_size=97)
    d.prefill(p[:2048])
    ld = d.prefill(p[2048:])
    for other, s in ((lb, b), (lc, c), (ld, d)):
        assert torch.equal(la, other)
        assert a.snapshot().equal(s.snapshot())
