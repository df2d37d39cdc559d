"""The RAM tier's rules: a byte budget, LRU eviction from the leaves, pins, and no tombstone cliff."""
import pytest

import muser
from muser.store import CutStore

from store_ids import BLOCK, ids


def session(engine, tokens):
    s = engine.new_session()
    s.prefill(tokens, chunk_size=BLOCK)
    return s


def stored(store) -> set:
    return {c.tokens() for c in store.index.cuts.values()}


def test_eviction_takes_the_least_recently_used_leaf_not_the_shared_prefix(f32):
    store = CutStore(f32, ram_bytes=1 << 26, block_size=BLOCK)
    stem = ids(24, 1)
    inner = session(f32, stem)                    # a prefix of `leaf`: an inner node
    leaf = session(f32, stem + ids(6, 2))
    other = session(f32, ids(20, 3))
    for s in (inner, leaf, other):
        store.put(s)
    store.install(f32.new_session(), store.longest_prefix(other.tokens))   # `other` most recent
    assert store.evict(1) == 1                    # LRU is `inner`, but `leaf` extends it
    assert stored(store) == {tuple(stem), tuple(other.tokens)}
    assert store.evict(1) == 1                    # now `inner` is a leaf and the LRU one
    assert stored(store) == {tuple(other.tokens)}
    assert store.stats()["evictions"]["ram"] == 2
    store.check_invariants()


def test_evicting_one_cut_never_makes_another_unusable(f32):
    """A shared block stays while any cut stands on it: no tombstone, no cliff."""
    store = CutStore(f32, ram_bytes=1 << 26, block_size=BLOCK)
    stem = ids(40, 5)
    first = session(f32, stem + ids(3, 6))        # creates the 5 stem blocks
    second = session(f32, stem + ids(9, 7))       # stands on the same blocks
    store.put(first)
    store.put(second)
    store.install(f32.new_session(), store.longest_prefix(second.tokens))
    assert store.evict(1) == 1 and stored(store) == {tuple(second.tokens)}
    s = f32.new_session()
    assert store.install(s, store.longest_prefix(second.tokens + [5])) == len(second.tokens)
    assert s.snapshot().equal(second.snapshot())
    store.evict()
    assert store.stats()["bytes"]["ram"] == 0 and store.stats()["blocks"]["total"] == 0
    store.check_invariants()


def test_a_pinned_cut_and_its_blocks_outlive_any_eviction(f32):
    store = CutStore(f32, ram_bytes=1 << 26, block_size=BLOCK)
    a, b = session(f32, ids(30, 1)), session(f32, ids(30, 2))
    store.put(a)
    store.put(b)
    hit = store.longest_prefix(a.tokens)
    with store.hold(hit):
        store.evict()                              # everything unpinned goes
        assert stored(store) == {tuple(a.tokens)}
        s = f32.new_session()
        store.install(s, hit)
        assert s.snapshot().equal(a.snapshot())
    store.evict()
    with pytest.raises(muser.StoreMiss):
        store.install(f32.new_session(), hit)      # evicted once released
    with pytest.raises(muser.StoreError):
        store.unpin(hit)


def test_the_budget_holds_and_a_cut_larger_than_it_is_not_stored(f32):
    probe = CutStore(f32, ram_bytes=1 << 26, block_size=BLOCK)
    probe.put(session(f32, ids(24, 0)))
    one = probe.stats()["bytes"]["ram"]            # a 24-token cut with its 3 blocks
    store = CutStore(f32, ram_bytes=int(2.5 * one), block_size=BLOCK)
    for seed in range(6):
        store.put(session(f32, ids(24, seed)))
        assert store.stats()["bytes"]["ram"] <= store.stats()["budget"]["ram"]
        store.check_invariants()
    assert store.stats()["cuts"]["total"] == 2 and store.stats()["evictions"]["ram"] == 4
    big = session(f32, ids(120, 9))
    assert store.put(big) is None
    st = store.stats()
    assert st["puts_rejected"] == 1 and st["cuts"]["total"] == 2 and st["bytes"]["ram"] <= int(2.5 * one)


def test_a_hit_evicted_after_its_lookup_is_a_typed_miss(f32):
    store = CutStore(f32, ram_bytes=1 << 26, block_size=BLOCK)
    s = session(f32, ids(20, 1))
    store.put(s)
    hit = store.longest_prefix(s.tokens)
    store.evict()
    t = f32.new_session()
    t.prefill(ids(4, 2))
    before = t.snapshot()
    with pytest.raises(muser.StoreMiss):
        store.install(t, hit)
    assert t.snapshot().equal(before)
    assert store.install_longest(t, s.tokens) == 0


def test_lookups_count_hits_and_reused_tokens(f32):
    store = CutStore(f32, ram_bytes=1 << 26, block_size=BLOCK)
    s = session(f32, ids(20, 1))
    store.put(s)
    assert store.longest_prefix(s.tokens + [3], limit=20).position == 20
    assert store.longest_prefix(s.tokens, limit=19) is None        # a cut longer than the limit
    assert store.longest_prefix(s.tokens[:19]) is None
    assert store.longest_prefix(s.tokens, record=False).position == 20
    st = store.stats()
    assert (st["lookups"], st["hits"], st["hit_tokens"]) == (3, 1, 20)
