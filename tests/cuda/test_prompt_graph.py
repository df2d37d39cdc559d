"""A session's first chunk through a prompt graph (backends/cuda/prompt_graph.py) gives the eager
exact chunk pass's bits: logits (torch.equal), every plane's rows and bookkeeping, and what the
session decodes next.  On a GPU the graph is captured and replayed (bf16); under Triton's
interpreter (MUSER_TRITON_INTERPRET=1) the same static-buffer pass runs eagerly on the CPU.

Lengths cover a bucket's edge (64 = a bucket, 65 = padded to 96), one row, and rings of window 4
that wrap many times inside the chunk (the eager pass takes the shadow route there; the prompt
pass stores after attending over its own rows).  Under the interpreter a padded bucket is held
to float32 rounding only: the interpreter's dot is numpy's matmul, whose rows follow the tile's
other rows (tests/cuda/test_triton_ops.py); a bucket's own length is held bitwise there too."""
import pytest
import torch
from cudautil import HAS_CUDA, needs_kernels

from muser.backends.cuda.chunk_step import chunk_pass
from muser.backends.cuda.graph import GraphRunner
from muser.backends.cuda.prompt_graph import BUCKETS, bucket_for
from muser.backends.step import forward as one_forward
from muser.env import Env
from muser.testing import tiny_model

pytestmark = needs_kernels


@pytest.fixture(scope="module")
def engine():
    dev, dt = ("cuda", "bfloat16") if HAS_CUDA else ("cpu", "float32")
    return tiny_model("gemma3", device=dev, dtype=dt, window=4, tokenizer=False, max_context=512)


@pytest.fixture(scope="module")
def runner(engine):
    return GraphRunner(engine, Env(prompt_graphs="on"), capture=HAS_CUDA)


def ids_of(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 384, (n,), generator=g).tolist()


def eager(runner):
    return lambda eng, ss, cs, al, pad, logits=True: chunk_pass(runner.step, eng, ss, cs, al, pad,
                                                                logits)


def same(a, b, exact):
    return torch.equal(a, b) if exact else torch.allclose(a, b, rtol=1e-4, atol=1e-5)


def taken(runner):
    st = runner.prompts.stats
    return st["replays"] + st["eager"]


@pytest.mark.parametrize("n", [1, 7, 64, 65])
def test_a_first_chunk_through_the_prompt_graph_has_the_eager_bits(engine, runner, n):
    ids = ids_of(n, n)
    a, b = engine.new_session(), engine.new_session()
    before = taken(runner)
    la = one_forward(engine, [a], [ids], True, False, pass_fn=runner.chunk_pass)
    assert taken(runner) == before + 1, runner.prompts.failed
    lb = one_forward(engine, [b], [ids], True, False, pass_fn=eager(runner))
    exact = HAS_CUDA or n in BUCKETS
    assert same(la, lb, exact)
    for pa, pb in zip(a.planes, b.planes):
        assert (pa.len, pa.end, pa.origin_physical) == (pb.len, pb.end, pb.origin_physical)
        ka, va = pa.logical_rows()
        kb, vb = pb.logical_rows()
        assert same(ka, kb, exact) and same(va, vb, exact)
    a.check_invariants()
    # what comes next: a decode-shaped row and a chunk, through the eager pass for both
    for more in ([5], [9, 10, 11]):
        xa = one_forward(engine, [a], [more], True, False, pass_fn=runner.chunk_pass)
        xb = one_forward(engine, [b], [more], True, False, pass_fn=eager(runner))
        assert same(xa, xb, exact)
    assert taken(runner) == before + 1                     # later chunks are not first chunks


def test_the_last_row_only_and_no_logits(engine, runner):
    ids = ids_of(30, 3)
    full = one_forward(engine, [engine.new_session()], [ids], True, False, pass_fn=eager(runner))
    last = one_forward(engine, [engine.new_session()], [ids], False, False, pass_fn=runner.chunk_pass)
    assert last.shape[0] == 1 and same(last[0], full[-1], HAS_CUDA)
    s = engine.new_session()
    none = one_forward(engine, [s], [ids], False, False, logits=False, pass_fn=runner.chunk_pass)
    assert none.shape[0] == 0 and s.position == 30


def test_what_a_prompt_graph_does_not_take(engine, runner):
    """Several sessions, a session past position 0, a chunk past the largest bucket: eager."""
    a, b = engine.new_session(), engine.new_session()
    assert not runner.prompts.applies([a, b], [[4, 5], [6]])
    one_forward(engine, [a], [[4, 5]], True, False, pass_fn=runner.chunk_pass)
    before = taken(runner)
    one_forward(engine, [a], [[7, 8]], True, False, pass_fn=runner.chunk_pass)
    assert taken(runner) == before and a.position == 4
    assert not runner.prompts.applies([engine.new_session()], [list(range(BUCKETS[-1] + 1))])
    assert runner.prompts.applies([b], [[6]])


def test_buckets_are_the_smallest_that_hold_the_chunk():
    assert [bucket_for(n) for n in (1, 64, 65, 96, 97, 2048, 2049)] == [64, 64, 96, 96, 128, 2048, None]
