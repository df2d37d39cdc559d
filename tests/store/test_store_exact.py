"""Installing a stored cut is restoring that session's snapshot, bit for bit, on both CPU paths;
the store refuses what it cannot install exactly."""
import pytest
import torch

import muser
from muser.store import CutStore

from store_ids import BLOCK, ids


def continue_both(a, b):
    """Identical calls on two sessions: every logit bitwise equal, and the caches stay equal."""
    for kind, arg in [("decode", 17), ("prefill", ids(9, 3)), ("extend", ids(6, 2)), ("decode", 5)]:
        x, y = getattr(a, kind)(arg), getattr(b, kind)(arg)
        assert torch.equal(x, y), f"{kind} diverged after install"
    assert a.snapshot().equal(b.snapshot())


def same_planes(a, b):
    for p, q in zip(a.planes, b.planes):
        assert p.metadata() == q.metadata()
        kp, vp = p.logical_rows()
        kq, vq = q.logical_rows()
        assert torch.equal(kp, kq) and torch.equal(vp, vq), f"layer {p.layer} rows differ"


@pytest.mark.parametrize("position", [1, 3, 4, 5, 7, 8, 9, 16, 23, 41])
def test_install_is_bitwise_the_snapshot_that_was_put(engine, position):
    store = CutStore(engine, ram_bytes=1 << 26, block_size=BLOCK)
    live = engine.new_session()
    live.prefill(ids(position, position), chunk_size=3)
    snap = live.snapshot()
    assert store.put(live).position == position
    hit = store.longest_prefix(ids(position, position) + [11, 12])
    assert hit is not None and hit.position == position and hit.tier == "ram"
    installed = engine.new_session()
    installed.prefill(ids(5, 99))                      # whatever was there is replaced
    assert store.install(installed, hit) == position
    restored = engine.restore(snap)
    assert installed.snapshot().equal(snap) and installed.tokens == live.tokens
    same_planes(installed, restored)
    continue_both(installed, restored)
    store.check_invariants()


@pytest.mark.parametrize("cut_at", [8, 13, 24, 30])
def test_an_installed_hit_equals_a_cold_prefill_of_its_ids_when_chunks_align(engine, cut_at):
    """Chunks aligned to the block size (the float32 path and the default path alike compute a
    row from the same chunk shape either way); with chunk-invariant paths any chunking will do."""
    store = CutStore(engine, ram_bytes=1 << 26, block_size=BLOCK)
    prompt = ids(40, 7)
    s = engine.new_session()
    s.prefill(prompt[:cut_at], chunk_size=BLOCK)
    store.put(s)
    s.prefill(prompt[cut_at:], chunk_size=BLOCK)
    hit = store.longest_prefix(prompt, limit=len(prompt) - 1)
    assert hit.position == cut_at
    warm, cold = engine.new_session(), engine.new_session()
    store.install(warm, hit)
    cold.prefill(prompt[:cut_at], chunk_size=BLOCK)
    assert warm.snapshot().equal(cold.snapshot())
    assert torch.equal(warm.prefill(prompt[cut_at:]), cold.prefill(prompt[cut_at:]))


def test_shared_blocks_are_stored_once_and_serve_every_cut_on_them(engine):
    store = CutStore(engine, ram_bytes=1 << 26, block_size=BLOCK)
    stem = ids(32, 1)
    sessions = []
    for tail in (ids(5, 2), ids(11, 3), []):
        s = engine.new_session()
        s.prefill(stem + tail, chunk_size=BLOCK)
        store.put(s)
        sessions.append(s)
    st = store.stats()
    assert st["cuts"]["total"] == 3
    assert st["blocks"]["total"] == 4 + 1            # the stem's 4 blocks once, + block 4 of stem+11
    rows = BLOCK * store.layout.row_bytes() * len(store.layout.prefix)
    windows = sum(store.index.cuts[k].nbytes for k in store.index.cuts)
    assert st["bytes"]["ram"] == 5 * rows + windows
    for s in sessions:
        t = engine.new_session()
        store.install(t, store.longest_prefix(s.tokens))
        assert t.snapshot().equal(s.snapshot())


def test_the_same_ids_computed_in_other_chunks_keep_their_own_rows(f32):
    """Two computations of one prefix may differ in bits on a path that is not chunk-invariant: each
    cut must come back with exactly its own rows, so unequal blocks become two variants.  The CPU
    paths are chunk-invariant now, so the difference is made: one element of block 3 moves by an ulp."""
    store = CutStore(f32, ram_bytes=1 << 26, block_size=BLOCK)
    prompt = ids(100, 4)
    a, b = f32.new_session(), f32.new_session()
    a.prefill(prompt[:96])                             # one chunk (over 64 rows: the fused attention)
    b.prefill(prompt, chunk_size=5)                    # twenty chunks
    growing = [(p, q) for p, q in zip(a.planes, b.planes) if p.kind == "growing"]
    k = growing[0][1].keys                             # [KV, allocated, D]
    k[0, 3 * BLOCK, 0] = torch.nextafter(k[0, 3 * BLOCK, 0], torch.tensor(float("inf"), dtype=k.dtype))
    differ = sum(any(not torch.equal(p.keys[:, i * BLOCK:(i + 1) * BLOCK], q.keys[:, i * BLOCK:(i + 1) * BLOCK])
                     or not torch.equal(p.values[:, i * BLOCK:(i + 1) * BLOCK],
                                        q.values[:, i * BLOCK:(i + 1) * BLOCK]) for p, q in growing)
                 for i in range(12))
    assert differ > 0, "test premise: the two chunkings differ somewhere"
    store.put(a)
    store.put(b)
    assert store.stats()["blocks"]["total"] == 12 + differ
    for s in (a, b):
        t = f32.new_session()
        store.install(t, store.longest_prefix(s.tokens))
        assert t.snapshot().equal(s.snapshot())


def test_a_session_of_another_model_or_encoding_is_refused(f32):
    from muser.testing import tiny_model
    store = CutStore(f32, ram_bytes=1 << 26, block_size=BLOCK)
    s = f32.new_session()
    s.prefill(ids(20))
    hit = store.put(s)
    others = {"encoding": tiny_model(window=4, tokenizer=False, dtype="bfloat16", quant="int8"),
              "model": tiny_model(window=4, tokenizer=False, seed=1)}
    for what, other in others.items():
        t = other.new_session()
        t.prefill(ids(20))
        before = t.snapshot()
        with pytest.raises(muser.StoreMismatch, match=what):
            store.put(t)
        with pytest.raises(muser.StoreMismatch, match=what):
            store.install(t, hit)
        assert t.snapshot().equal(before)
        theirs = CutStore(other, ram_bytes=1 << 26, block_size=BLOCK)
        assert theirs.namespace != store.namespace and theirs.longest_prefix(ids(20)) is None
        with pytest.raises(muser.StoreMismatch):
            theirs.install(t, hit)                     # a hit of another store


def test_sessions_that_cannot_be_keyed_are_refused(f32):
    store = CutStore(f32, ram_bytes=1 << 26, block_size=BLOCK)
    empty = f32.new_session()
    assert store.put(empty) is None
    s = f32.new_session()
    s.prefill(ids(12))
    cp = s.checkpoint(3)
    s.extend(ids(3, 5))
    with pytest.raises(muser.StoreError, match="checkpoint"):
        store.put(s)
    s.rollback(cp, 0)
    anonymous = f32.restore(muser.SessionSnapshot(12, s.snapshot().encoding, s.snapshot().planes))
    with pytest.raises(muser.StoreError, match="token ids"):
        store.put(anonymous)                           # lineage unknown: cannot be addressed
    assert store.stats()["cuts"]["total"] == 0


def test_the_embedded_model_on_the_default_path(gemma_default):
    """The real 270M model, bf16 + int8 (the CPU default), a cut past the 512-token window."""
    engine = gemma_default
    store = CutStore(engine, ram_bytes=1 << 28)
    text = " ".join(f"item {i}: the ring keeps the window, the growing plane keeps the rest." for i in range(60))
    prompt = engine.tokenizer.encode(text)[:600]
    live = engine.new_session()
    live.prefill(prompt)
    snap = live.snapshot()
    store.put(live)
    hit = store.longest_prefix(prompt + [107], limit=len(prompt))
    assert hit.position == len(prompt)
    s = engine.new_session()
    store.install(s, hit)
    assert s.snapshot().equal(snap)
    same_planes(s, engine.restore(snap))
    assert torch.equal(s.decode(107), live.decode(107))
    layout = store.layout
    assert store.stats()["bytes"]["ram"] == \
        len(prompt) * layout.row_bytes() * len(layout.prefix) + layout.window_rows(len(prompt)) * layout.row_bytes()
