"""cache/many.py: a session's planes written, logged and restored together -- the same planes,
logs and rows as plane by plane (`torch.equal`), through ring wraps, chunks wider than the ring,
growing planes and open checkpoints; and copy_rows' mixed pairs."""
import pytest
import torch

from muser.cache import Checkpoint, GrowingPlane, RingPlane
from muser.cache.many import copy_rows, store_many
from muser.errors import CacheError, CheckpointError


def session(kv=2, d=3):
    """A hybrid session's planes: rings of 3 and 5 (two of 3: lockstep-like) and a growing one."""
    return [RingPlane(0, 3, 64, kv, d, torch.float32, "cpu"), RingPlane(1, 5, 64, kv, d, torch.float32, "cpu"),
            GrowingPlane(2, 64, kv, d, torch.float32, "cpu", min_rows=4),
            RingPlane(3, 3, 64, kv, d, torch.float32, "cpu")]


def chunk(n, seed, planes):
    g = torch.Generator().manual_seed(seed)
    return ([torch.randn(n, p.kv_heads, p.head_dim, generator=g) for p in planes],
            [torch.randn(n, p.kv_heads, p.head_dim, generator=g) for p in planes])


def same(a, b):
    for p, q in zip(a, b):
        assert p.bookmark() == q.bookmark()
        (pk, pv), (qk, qv) = p.logical_rows(), q.logical_rows()
        assert torch.equal(pk, qk) and torch.equal(pv, qv)
        assert torch.equal(p.keys, q.keys) and torch.equal(p.values, q.values)   # slots too


# chunk sizes, then (checkpoint rows, chunks under it, keep) rounds
CASES = [
    ([1, 1, 1, 1, 1, 1, 1], []),
    ([2, 7, 1, 4], []),                                # a chunk wider than every ring
    ([4, 1], [(4, [1, 1, 2], 1), (3, [3], 0), (6, [6], 6)]),
    ([9], [(8, [8], 3), (1, [1], 0), (2, [1, 1], 2)]),
]


@pytest.mark.parametrize("sizes, rounds", CASES)
def test_store_many_equals_storing_each_plane(sizes, rounds):
    a, b = session(), session()
    pos, seed = 0, 0
    for n in sizes:
        ks, vs = chunk(n, seed, a)
        store_many(a, pos, ks, vs)
        for p, k, v in zip(b, ks, vs):
            p.store(pos, k, v)
        same(a, b)
        pos, seed = pos + n, seed + 1
    for rows, parts, keep in rounds:
        ca, cb = Checkpoint(a, pos, rows), Checkpoint(b, pos, rows)
        at = pos
        for n in parts:
            ks, vs = chunk(n, seed, a)
            store_many(a, at, ks, vs)
            for p, k, v in zip(b, ks, vs):
                p.store(at, k, v)
            at, seed = at + n, seed + 1
        for la, lb in zip(ca.logs, cb.logs):
            assert [r0 for r0, _, _ in la.evictions] == [r0 for r0, _, _ in lb.evictions]
            for (_, k1, v1), (_, k2, v2) in zip(la.evictions, lb.evictions):
                assert torch.equal(k1, k2) and torch.equal(v1, v2)
        ca.rollback(keep)
        cb.rollback(keep)
        same(a, b)
        pos += keep
        for p in a:
            p.check_invariants()


def test_store_many_checks_every_plane_before_anything_moves():
    a = session()
    store_many(a, 0, *chunk(4, 0, a))
    marks, keys = [p.bookmark() for p in a], [p.keys.clone() for p in a]
    ks, vs = chunk(2, 1, a)
    ks[-1] = ks[-1][:, :1]                             # the last plane's rows have a wrong shape
    with pytest.raises(CacheError, match="layer 3: store keys must be"):
        store_many(a, 4, ks, vs)
    with pytest.raises(CacheError, match="discontin|position"):
        store_many(a, 5, *chunk(2, 1, a))              # not where the planes end
    cp = Checkpoint(a, 4, 1)
    with pytest.raises(CheckpointError, match="allows 1 rows"):
        store_many(a, 4, *chunk(2, 1, a))
    cp.rollback(0)
    assert [p.bookmark() for p in a] == marks
    assert all(torch.equal(p.keys, k) for p, k in zip(a, keys))


def test_rows_placed_ahead_commit_as_a_store_does():
    """A growing plane (`writes_ahead`) given its rows past its end first (what a captured chunk
    pass does after `make_room`), then committed with placed=True: the same planes as a store;
    under a checkpoint the same rollback.  A ring cannot be told its rows are placed."""
    a, b = session(), session()
    placed = [p.writes_ahead for p in a]
    assert placed == [False, False, True, False]
    pos = 0
    for n, rows in ((3, 0), (5, 6), (40, 0)):            # 40: the growing plane grows
        cp = (Checkpoint(a, pos, rows), Checkpoint(b, pos, rows)) if rows else None
        ks, vs = chunk(n, pos, a)
        for p, k, v, ahead in zip(a, ks, vs, placed):
            if ahead:
                p.make_room(pos, n)
                p.keys[:, pos:pos + n] = k.transpose(0, 1)
                p.values[:, pos:pos + n] = v.transpose(0, 1)
        store_many(a, pos, ks, vs, placed)
        store_many(b, pos, ks, vs)
        same(a, b)
        if cp:
            cp[0].rollback(2)
            cp[1].rollback(2)
            same(a, b)
            n = 2
        pos += n
    with pytest.raises(CacheError, match="layer 0: a ring plane cannot hold rows past its end"):
        store_many(a, pos, *chunk(1, 9, a), [True, False, True, False])
    with pytest.raises(CacheError, match="discontin|position"):
        a[2].make_room(pos + 1, 1)
    assert a[2].end == pos


def test_copy_rows_takes_mixed_pairs():
    base = torch.arange(24.0).view(2, 4, 3)            # [KV, rows, D], head-major
    dst = [torch.zeros(2, 3), torch.zeros(4, 3, dtype=torch.float64), base[:, 1:3].transpose(0, 1),
           torch.zeros(1, 3)]
    src = [torch.ones(2, 3), torch.full((4, 3), 2.0), -torch.ones(2, 2, 3), torch.full((1, 3), -0.0)]
    copy_rows(dst, src)
    for d, s in zip(dst, src):
        assert torch.equal(d, s.to(d.dtype))
    assert torch.equal(torch.signbit(dst[3]), torch.ones(1, 3, dtype=torch.bool))   # -0.0 kept
    copy_rows([], [])


def test_a_lockstep_plane_follows_only_from_the_same_state():
    a, b = session()[0], session()[0]
    ks, vs = chunk(1, 0, [b])
    b.store(0, ks[0], vs[0])
    before = a.bookmark()
    a.advance(1)
    with pytest.raises(CacheError, match="cannot follow"):
        type(b).follow([b], before, a.bookmark())
