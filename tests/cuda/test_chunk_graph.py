"""One session's chunk through a chunk graph (backends/cuda/chunk_graph.py) gives the eager exact
chunk pass's bits: logits (torch.equal), every plane's rows and bookkeeping, and what the session
computes next -- for a first chunk, a later chunk over a history read in place (rings wrapped
many times, growing planes), and verification blocks rolled back as a speculative round does.
On a GPU the graphs are captured and replayed (bf16); under Triton's interpreter
(MUSER_TRITON_INTERPRET=1) the same static-buffer pass runs eagerly on the CPU.

Under the interpreter a padded bucket is held to float32 rounding only: the interpreter's dot is
numpy's matmul, whose rows follow the tile's other rows (tests/cuda/test_triton_ops.py); a
chunk of a bucket's own length is held bitwise there too."""
import pytest
import torch
from cudautil import HAS_CUDA, needs_kernels

from muser.backends.cuda.chunk_graph import BUCKETS, bucket_for, takes
from muser.backends.cuda.chunk_step import chunk_pass
from muser.backends.cuda.graph import GraphRunner
from muser.backends.step import forward as one_forward
from muser.env import Env
from muser.errors import CacheOverflow
from muser.testing import tiny_model

pytestmark = needs_kernels


@pytest.fixture(scope="module")
def engine():
    dev, dt = ("cuda", "bfloat16") if HAS_CUDA else ("cpu", "float32")
    return tiny_model("gemma3", device=dev, dtype=dt, window=4, tokenizer=False, max_context=512)


@pytest.fixture(scope="module", params=["staged", "apart"])
def runner(engine, request):
    """Both ways a captured pass reads keys (MUSER_GRAPH_KEYS): one ordered view -- a growing
    plane's rows placed past its end, a ring's history gathered into a shadow -- or apart."""
    return GraphRunner(engine, Env(chunk_graphs="on", graph_keys=request.param), capture=HAS_CUDA)


def ids_of(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 384, (n,), generator=g).tolist()


def eager(runner):
    return lambda eng, ss, cs, al, pad, logits=True: chunk_pass(runner.step, eng, ss, cs, al, pad,
                                                                logits)


def same(a, b, exact):
    return torch.equal(a, b) if exact else torch.allclose(a, b, rtol=1e-4, atol=1e-5)


def taken(runner):
    st = runner.graphs.stats
    return st["replays"] + st["eager"]


def planes_equal(a, b, exact):
    for pa, pb in zip(a.planes, b.planes):
        assert (pa.len, pa.end, pa.origin_physical) == (pb.len, pb.end, pb.origin_physical)
        ka, va = pa.logical_rows()
        kb, vb = pb.logical_rows()
        assert same(ka, kb, exact) and same(va, vb, exact)
    a.check_invariants()


@pytest.mark.parametrize("history, n", [(0, 1), (0, 7), (0, 64), (0, 65), (13, 16), (13, 5),
                                        (40, 2), (150, 32)])
def test_a_chunk_through_a_graph_has_the_eager_bits(engine, runner, history, n):
    """After `history` tokens (through the eager pass for both sessions), a chunk of n."""
    a, b = engine.new_session(), engine.new_session()
    if history:
        h = ids_of(history, 99)
        for s in (a, b):
            one_forward(engine, [s], [h], False, False, pass_fn=eager(runner))
    ids = ids_of(n, n)
    before = taken(runner)
    la = one_forward(engine, [a], [ids], True, False, pass_fn=runner.chunk_pass)
    assert taken(runner) == before + 1, runner.graphs.failed
    lb = one_forward(engine, [b], [ids], True, False, pass_fn=eager(runner))
    exact = HAS_CUDA or n in BUCKETS
    assert same(la, lb, exact)
    planes_equal(a, b, exact)
    # what comes next, through the eager pass for both
    for more in ([5], [9, 10, 11]):
        xa = one_forward(engine, [a], [more], True, False, pass_fn=eager(runner))
        xb = one_forward(engine, [b], [more], True, False, pass_fn=eager(runner))
        assert same(xa, xb, exact)


def test_a_verification_round_rolls_back_to_the_eager_state(engine, runner):
    """A speculative round: checkpoint, a block of 1 + k through the graph, keep 1 + accepted."""
    a, b = engine.new_session(), engine.new_session()
    h = ids_of(30, 7)
    for s in (a, b):
        one_forward(engine, [s], [h], False, False, pass_fn=eager(runner))
    for block, keep in ((ids_of(8, 1), 3), (ids_of(4, 2), 4), (ids_of(16, 3), 1)):
        outs = []
        for s, fn in ((a, runner.chunk_pass), (b, eager(runner))):
            cp = s.checkpoint(len(block))
            outs.append(one_forward(engine, [s], [block], True, False, pass_fn=fn))
            s.rollback(cp, keep=keep)
        assert same(outs[0], outs[1], HAS_CUDA or len(block) in BUCKETS)
        assert a.tokens == b.tokens
        planes_equal(a, b, HAS_CUDA or len(block) in BUCKETS)


def test_the_last_row_only_and_no_logits(engine, runner):
    ids = ids_of(30, 3)
    full = one_forward(engine, [engine.new_session()], [ids], True, False, pass_fn=eager(runner))
    last = one_forward(engine, [engine.new_session()], [ids], False, False, pass_fn=runner.chunk_pass)
    assert last.shape[0] == 1 and same(last[0], full[-1], HAS_CUDA)
    s = engine.new_session()
    none = one_forward(engine, [s], [ids], False, False, logits=False, pass_fn=runner.chunk_pass)
    assert none.shape[0] == 0 and s.position == 30


def test_a_chunk_past_the_context_is_refused_before_the_graph_writes(engine, runner):
    """The stores' checks run before the replay: a refused chunk leaves every plane (and the
    rows past a growing plane's end the graph would have written) as they were."""
    a, b = engine.new_session(), engine.new_session()
    h = ids_of(engine.max_context - 10, 5)
    for s in (a, b):
        one_forward(engine, [s], [h], False, False, pass_fn=eager(runner))
    before = taken(runner)
    with pytest.raises(CacheOverflow):
        one_forward(engine, [a], [ids_of(16, 6)], True, False, pass_fn=runner.chunk_pass)
    assert taken(runner) == before
    planes_equal(a, b, True)
    xa = one_forward(engine, [a], [ids_of(10, 6)], True, False, pass_fn=runner.chunk_pass)
    xb = one_forward(engine, [b], [ids_of(10, 6)], True, False, pass_fn=eager(runner))
    assert same(xa, xb, HAS_CUDA)


def test_what_a_chunk_graph_does_not_take(engine, runner):
    """Several sessions in one pass; past 2,048 rows a length that is not a bucket's, or past the
    largest bucket taken (MUSER_CHUNK_GRAPH_ROWS): eager."""
    a, b = engine.new_session(), engine.new_session()
    g = runner.graphs
    assert not g.applies([a, b], [[4, 5], [6]])
    assert g.applies([b], [[6]]) and g.applies([b], [list(range(2048))])
    assert not g.applies([a], [list(range(2049))])
    for limit, n, ok in ((4096, 3072, True), (4096, 4096, True), (4096, 3073, False),
                         (4096, 6144, False), (2048, 3072, False), (1024, 1025, False)):
        r = GraphRunner(engine, Env(chunk_graphs="on", chunk_graph_rows=limit), capture=False)
        assert r.graphs.applies([a], [list(range(n))]) == ok, (limit, n)


@pytest.mark.parametrize("rows, limit, expect", [
    (1, 16384, True), (2048, 16384, True), (2049, 16384, False), (3072, 2048, False),
    (8192, 16384, True), (9000, 16384, False), (16384, 16384, True), (16384, 8192, False),
    (600, 512, False), (512, 512, True),
])
def test_long_chunks_take_a_graph_only_at_a_buckets_exact_length(rows, limit, expect):
    assert takes(rows, limit) == expect


@pytest.mark.parametrize("n, limit, bucket", [
    (1, 16384, 2), (2, 16384, 2), (3, 16384, 4), (16, 16384, 16), (17, 16384, 32),
    (65, 16384, 96), (2048, 2048, 2048), (2049, 2048, None), (2049, 16384, 3072),
    (12289, 16384, 16384), (16384, 16384, 16384), (16385, 16384, None), (3000, 4000, 3072), (3100, 4000, None),
])
def test_buckets_are_the_smallest_that_hold_the_chunk_within_the_limit(n, limit, bucket):
    assert bucket_for(n, limit) == bucket


@pytest.mark.skipif(not HAS_CUDA, reason="3,072-row chunks: too slow under the interpreter")
def test_a_long_chunk_through_an_exact_bucket_has_the_eager_bits():
    """MUSER_CHUNK_GRAPH_ROWS=4096: a 3,072-token first chunk (its own bucket: wide TMA tiles,
    ring shadows of 3,072 rows), then a 700-token chunk over it and one decode step -- graph ==
    the eager pass, bitwise, every row's logits and every plane."""
    eng = tiny_model("gemma3", device="cuda", dtype="bfloat16", window=4, tokenizer=False,
                     max_context=4608)
    runner = GraphRunner(eng, Env(chunk_graphs="on", chunk_graph_rows=4096), capture=True)
    assert runner.graphs.limit == 4096
    a, b = eng.new_session(), eng.new_session()
    for n, seed in ((3072, 1), (700, 2), (1, 3)):
        ids = ids_of(n, seed)
        before = runner.graphs.stats["replays"]
        la = one_forward(eng, [a], [ids], True, False, pass_fn=runner.chunk_pass)
        assert runner.graphs.stats["replays"] == before + 1, runner.graphs.failed
        lb = one_forward(eng, [b], [ids], True, False, pass_fn=eager(runner))
        assert la.shape == lb.shape and torch.equal(la, lb)
        planes_equal(a, b, True)
