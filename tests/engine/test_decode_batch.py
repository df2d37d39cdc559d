"""A batched decode step over several sessions equals each session decoding alone, bit for bit
(on the row-invariant int8 path), and a failure rolls every session back."""
import pytest
import torch

from muser.testing import tiny_model


@pytest.fixture(scope="module")
def engine():
    return tiny_model("gemma3", window=4, tokenizer=False, dtype="bfloat16", quant="int8")


def sessions(engine, lengths):
    out = []
    for i, n in enumerate(lengths):
        s = engine.new_session()
        s.prefill(list(range(10 + i, 10 + i + n)))
        out.append(s)
    return out


def test_batched_decode_equals_decoding_alone(engine):
    lengths = [1, 3, 4, 9, 17]                  # filling rings, full rings, wrapped rings
    batched, alone = sessions(engine, lengths), sessions(engine, lengths)
    for step in range(6):
        toks = [(7 * step + i) % 300 + 3 for i in range(len(lengths))]
        out = engine.decode_batch(batched, toks)
        ref = torch.stack([s.decode(t) for s, t in zip(alone, toks)])
        assert torch.equal(out, ref)
    for a, b in zip(batched, alone):
        assert a.snapshot().equal(b.snapshot())


def test_failed_batched_step_rolls_every_session_back(engine, monkeypatch):
    ss = sessions(engine, [2, 6, 9])
    before = [s.snapshot() for s in ss]
    real = engine.backend.attention
    calls = {"n": 0}

    def flaky(*a, **k):
        calls["n"] += 1
        if calls["n"] == 5:
            raise RuntimeError("injected")
        return real(*a, **k)
    monkeypatch.setattr(engine.backend, "attention", flaky)
    with pytest.raises(RuntimeError):
        engine.decode_batch(ss, [5, 6, 7])
    monkeypatch.setattr(engine.backend, "attention", real)
    assert all(s.snapshot().equal(b) for s, b in zip(ss, before))
