"""The one forward (`Engine.forward`, backends/step.py): 1..B sessions x 1..k rows in one call.
Every shape gives each session what it gets alone, bit for bit, on the int8 CPU path (shared
matmuls) and on the float path (one pass per session); input is checked before anything runs."""
import pytest
import torch

import muser
from muser.testing import tiny_model

WINDOW = 4


@pytest.fixture(scope="module", params=["bf16-int8", "f32"])
def engine(request):
    if request.param == "f32":
        return tiny_model("gemma3", window=WINDOW, tokenizer=False)
    return tiny_model("gemma3", window=WINDOW, tokenizer=False, dtype="bfloat16", quant="int8")


def sessions(engine, lengths, seed=0):
    out = []
    for i, n in enumerate(lengths):
        s = engine.new_session()
        s.prefill([(seed + 7 * i + j) % 300 + 3 for j in range(n)])
        out.append(s)
    return out


@pytest.mark.parametrize("lengths, block", [([1, 3, 9], 5), ([2, 6], 16), ([4, 4, 4, 4], 1)])
def test_a_batched_verification_step_equals_each_session_extending_alone(engine, lengths, block):
    batched, alone = sessions(engine, lengths), sessions(engine, lengths)
    chunks = [[(11 * i + j) % 300 + 3 for j in range(block)] for i in range(len(lengths))]
    out = engine.forward(batched, chunks, all_logits=True)
    assert out.shape == (block * len(lengths), engine.spec.vocab_size)
    ref = torch.cat([s.extend(c) for s, c in zip(alone, chunks)])
    assert torch.equal(out, ref)
    last = engine.forward(batched, [[5]] * len(lengths), all_logits=False, pad=False)
    assert torch.equal(last, torch.stack([s.decode(5) for s in alone]))
    for a, b in zip(batched, alone):
        assert a.snapshot().equal(b.snapshot()) and a.tokens == b.tokens


def test_more_sessions_than_one_pass_holds_still_equal_each_alone(engine):
    """70 sessions: one pass with the native kernels (exact rows); without them the int8 path
    shares matmuls across 64 rows only (the aten kernel's row-invariant range), then a second pass."""
    lengths = [1 + i % 9 for i in range(70)]
    batched, alone = sessions(engine, lengths, seed=1), sessions(engine, lengths, seed=1)
    toks = [(5 * i) % 300 + 3 for i in range(70)]
    out = engine.decode_batch(batched, toks)
    assert torch.equal(out, torch.stack([s.decode(t) for s, t in zip(alone, toks)]))


def test_bad_input_is_refused_before_anything_runs(engine):
    a, b = sessions(engine, [3, 5])
    before = [a.snapshot(), b.snapshot()]
    with pytest.raises(muser.RequestError, match="appears twice"):
        engine.forward([a, a], [[4], [5]])
    with pytest.raises(muser.RequestError, match="2 sessions and 1 chunks"):
        engine.forward([a, b], [[4]])
    with pytest.raises(muser.RequestError, match="token ids must be in"):
        engine.forward([a, b], [[4], [10 ** 9]])
    with pytest.raises(muser.RequestError, match="at least one token"):
        engine.forward([a, b], [[4], []])
    assert a.snapshot().equal(before[0]) and b.snapshot().equal(before[1])
    assert engine.decode_batch([], []).shape == (0, engine.spec.vocab_size)


@pytest.mark.parametrize("ids, refused", [
    ([4, 5.0], "must be integers"), ([4, "5"], "must be integers"), ([4, None], "must be integers"),
    ([2 ** 70], "must be integers"), ([-1, 4], r"must be in \[0, \d+\), got \[-1\]"),
    ([4, 10 ** 9, 5], r"got \[1000000000\]"), ([], "at least one token"),
    ([4] * 2000 + [10 ** 9], r"got \[1000000000\]"), ([-3] + [4] * 1500, r"got \[-3\]"),
    (torch.tensor([[4, 5]]), r"1-D sequence, got a tensor of shape \(1, 2\)"),
    (torch.tensor([4.0, 5.0]), "must be integers"),
])
def test_token_ids_that_are_not_vocabulary_integers_are_refused_whole(engine, ids, refused):
    s = sessions(engine, [3])[0]
    before = s.snapshot()
    with pytest.raises(muser.RequestError, match=refused):
        s.prefill(ids)
    assert s.snapshot().equal(before) and s.position == 3


def test_integer_likes_are_taken_as_their_values(engine):
    """numpy integers, a tensor of ids, bools (ints in Python): the same logits as plain ints."""
    import numpy as np
    ref = engine.new_session().prefill([4, 7, 1])
    for ids in ([np.int64(4), np.int32(7), True], torch.tensor([4, 7, 1]),
                np.array([4, 7, 1])):
        s = engine.new_session()
        assert torch.equal(s.prefill(ids), ref) and s.tokens == [4, 7, 1]


def test_validated_ids_reach_the_backend_packed_once(engine, monkeypatch):
    """The checked ids go on as the int64 array they were checked in (a CUDA chunk copies its
    buffer instead of packing a 16k list again, backends/cuda/chunk_step.py); the session's
    lineage stays a list of ints."""
    from array import array
    seen = []
    forward = engine.backend.forward

    def spy(eng, sessions, chunks, *a, **kw):
        seen.extend(chunks)
        return forward(eng, sessions, chunks, *a, **kw)

    monkeypatch.setattr(engine.backend, "forward", spy)
    s = engine.new_session()
    s.prefill([4, 7, 1, 9, 2], chunk_size=3)
    s.extend([5, 6])
    s.decode(8)
    assert [(type(c), c.typecode, list(c)) for c in seen] == [
        (array, "q", [4, 7, 1]), (array, "q", [9, 2]), (array, "q", [5, 6]), (array, "q", [8])]
    assert s.tokens == [4, 7, 1, 9, 2, 5, 6, 8] and all(type(t) is int for t in s.tokens)


def test_a_prompt_piece_without_logits_leaves_the_same_planes_and_final_logits(engine):
    """`prefill(piece, logits=False)` skips the head of a piece that is not the prompt's last
    (the server splits at cut points): nothing else changes, bit for bit."""
    ids = [(5 * j) % 300 + 3 for j in range(23)]
    a, b = engine.new_session(), engine.new_session()
    assert a.prefill(ids[:9], logits=False) is None
    la = a.prefill(ids[9:])
    b.prefill(ids[:9])
    lb = b.prefill(ids[9:])
    assert torch.equal(la, lb)
    for pa, pb in zip(a.snapshot().planes, b.snapshot().planes):
        assert torch.equal(pa.keys, pb.keys) and torch.equal(pa.values, pb.values)
