"""One arithmetic per token (issue 12) for the 2025-26 families on the CPU default configuration
(bf16 + int8, native kernels): a token's logits and K/V rows depend on the ids before it alone --
not on the chunking, on whether it is a decode step or a row of an extend, or on the batch.
Experts (row-invariant routing and a8w8 experts), attention sinks (in the positional kernel's
merge), KV-shared layers, per-layer inputs, post-norm wiring and wide global heads all keep it."""
import pytest
import torch

from muser.model import native
from muser.testing import FAMILIES, tiny_model

pytestmark = pytest.mark.skipif(not native.available(), reason="the exact-rows path needs the native kernels")
N = 37


def ids(n, seed=0):
    return torch.randint(3, 384, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module", params=FAMILIES)
def engine(request):
    return tiny_model(request.param, window=4, tokenizer=False, dtype="bfloat16", quant="int8")


@pytest.mark.parametrize("chunks", [[1] * N, [5], [17, 3, 17], [2, 35]])
def test_any_chunking_leaves_the_same_logits_and_rows(engine, chunks):
    prompt = ids(N, 1)
    whole = engine.new_session()
    want = whole.prefill(prompt, chunk_size=N)
    assert engine.exact_rows
    s, pos = engine.new_session(), 0
    pieces = chunks if sum(chunks) == N else [chunks[0]] * (-(-N // chunks[0]))
    for c in pieces:
        got = s.prefill(prompt[pos:pos + c])
        pos += c
    assert torch.equal(got, want) and s.snapshot().equal(whole.snapshot())


def test_every_row_of_an_extend_equals_the_decode_step(engine):
    prompt = ids(N, 2)
    a, b = engine.new_session(), engine.new_session()
    a.prefill(prompt[:9])
    b.prefill(prompt[:9])
    rows = a.extend(prompt[9:])
    for i, t in enumerate(prompt[9:]):
        assert torch.equal(b.decode(t), rows[i]), f"row {i}"
    assert a.snapshot().equal(b.snapshot())


def test_batched_decode_equals_alone(engine):
    starts = [1, 4, 11, 23]
    make = lambda: [engine.new_session() for _ in starts]          # noqa: E731
    batched, alone = make(), make()
    for s, t, n in zip(batched, alone, starts):
        s.prefill(ids(n, n))
        t.prefill(ids(n, n))
    toks = [5, 6, 7, 8]
    assert torch.equal(engine.decode_batch(batched, toks), torch.stack([s.decode(t) for s, t in zip(alone, toks)]))
