"""The exactness contract on tiny models: restore replays bitwise, rollback is indistinguishable,
and the ring backend agrees with the full-history oracle across every wrap phase."""
import pytest
import torch

from muser.testing import FAMILIES, continue_both, prompt_ids as ids, tiny_model

WINDOW = 4


@pytest.fixture(scope="module", params=["gemma3", "cohere2", "gemma3-bf16-int8", *FAMILIES,
                                        *(f"{a}-bf16-int8" for a in FAMILIES)])
def engines(request):
    """(production engine, f32 oracle), for every family.  The int8 fast path (the CPU
    default) must keep every bitwise contract too."""
    arch, *fast = request.param.split("-")
    oracle = tiny_model(arch, window=WINDOW, tokenizer=False, backend="oracle")
    if fast:
        return tiny_model(arch, window=WINDOW, tokenizer=False, dtype="bfloat16", quant="int8"), oracle
    return tiny_model(arch, window=WINDOW, tokenizer=False), oracle


@pytest.mark.parametrize("chunk", [1, 3, 4, 7, 64])
def test_ring_agrees_with_oracle_across_wraps(engines, chunk):
    ring, oracle = engines
    if ring.config.quant != "none":
        pytest.skip("the int8 path's accuracy is pinned against f32 on the real model (test_fast_path)")
    prompt = ids(29, seed=chunk)
    a, b = ring.new_session(), oracle.new_session()
    la = a.prefill(prompt, chunk_size=chunk)
    lb = b.prefill(prompt, chunk_size=chunk)
    torch.testing.assert_close(la, lb, rtol=1e-4, atol=1e-4)
    for t in ids(9, seed=99):
        torch.testing.assert_close(a.decode(t), b.decode(t), rtol=1e-4, atol=1e-4)
    ext = ids(6, seed=7)
    torch.testing.assert_close(a.extend(ext), b.extend(ext), rtol=1e-4, atol=1e-4)
    a.check_invariants()


@pytest.mark.parametrize("position", [1, 3, 4, 5, 8, 11, 13])
@pytest.mark.parametrize("backend", [0, 1])
def test_restore_replays_bitwise_at_every_wrap_phase(engines, position, backend):
    if backend == 1 and engines[0].config.quant != "none":
        pytest.skip("oracle already covered by the float parametrizations")
    engine = engines[backend]
    live = engine.new_session()
    live.prefill(ids(position, position), chunk_size=3)
    restored = engine.restore(live.snapshot())
    assert restored.position == live.position == position
    for a, b in zip(live.planes, restored.planes):
        assert a.metadata() == b.metadata()
    continue_both(live, restored)


def test_snapshot_of_one_backend_is_refused_by_the_other(engines):
    import muser
    ring, oracle = engines
    s = ring.new_session()
    s.prefill(ids(6))
    with pytest.raises(muser.EncodingMismatch):
        oracle.restore(s.snapshot())
    o = oracle.new_session()
    o.prefill(ids(6))
    with pytest.raises(muser.EncodingMismatch):
        ring.restore(o.snapshot())


@pytest.mark.parametrize("prefix, block, keep", [(2, 3, 1), (6, 5, 0), (9, 4, 4), (3, 9, 6), (10, 7, 2), (1, 16, 11)])
def test_rollback_is_indistinguishable_from_consuming_only_the_kept_tokens(engines, prefix, block, keep):
    engine = engines[0]
    pre, blk = ids(prefix, 5), ids(block, 6)
    a = engine.new_session()
    a.prefill(pre)
    cp = a.checkpoint(block)
    a.extend(blk)
    a.rollback(cp, keep)
    assert a.position == prefix + keep and a.tokens == pre + blk[:keep]
    # Reference: the same history, the kept tokens fed the same way (one extend of the block
    # prefix), without any checkpoint.
    b = engine.new_session()
    b.prefill(pre)
    if keep:
        b.extend(blk[:keep])
    assert a.snapshot().equal(b.snapshot())
    continue_both(a, b)


def test_failed_forward_leaves_session_unchanged(engines, monkeypatch):
    engine = engines[0]
    s = engine.new_session()
    s.prefill(ids(7))
    before = s.snapshot()
    calls = {"n": 0}
    real = engine.backend.attention

    def flaky(*a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected fault in layer 2")
        return real(*a, **k)
    monkeypatch.setattr(engine.backend, "attention", flaky)
    with pytest.raises(RuntimeError):
        s.prefill(ids(5, 9))
    monkeypatch.setattr(engine.backend, "attention", real)
    assert s.snapshot().equal(before) and s.position == 7
    s.check_invariants()


def test_discontinuous_or_bad_input_is_typed(engines):
    import muser
    engine = engines[0]
    s = engine.new_session()
    with pytest.raises(muser.RequestError):
        s.prefill([])
    with pytest.raises(muser.RequestError):
        s.decode(10**9)
    assert s.position == 0
