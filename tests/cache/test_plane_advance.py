"""`Plane.advance(n)`: the one way bookkeeping moves (metadata only), its lockstep form for the
CUDA graph runner, bookmark / rewind, and that no code outside cache/plane.py writes a plane's
fields."""
import re
from pathlib import Path

import pytest
import torch

from muser.cache import Checkpoint, GrowingPlane, RingPlane
from muser.cache.many import advance_lockstep
from muser.errors import CacheError, CheckpointError

ROOT = Path(__file__).resolve().parents[2]


def ring(capacity, max_context=1 << 10, kv=1, d=2):
    return RingPlane(0, capacity, max_context, kv, d, torch.float32, "cpu")


def growing(max_context=1 << 10, kv=1, d=2):
    return GrowingPlane(0, max_context, kv, d, torch.float32, "cpu", min_rows=4)


def rows(n, seed=0, kv=1, d=2):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, kv, d, generator=g), torch.randn(n, kv, d, generator=g)


def test_advance_worked_examples_from_the_docstring():
    p = ring(4)
    p.store(0, *rows(8))                             # holds 4 5 6 7 at slots 0..3
    assert (p.origin_logical, p.origin_physical, p.len) == (4, 0, 4)
    assert p.advance(1) == (0, 0)                    # 8 -> slot 0; origin 5 at slot 1
    assert (p.origin_logical, p.origin_physical, p.len) == (5, 1, 4)
    assert p.advance(6) == (3, 2)                    # 9..14: 11..14 live, 11 at slot 3
    assert (p.origin_logical, p.origin_physical, p.len) == (11, 3, 4)


@pytest.mark.parametrize("make", [lambda: ring(5), lambda: ring(64), growing])
def test_advance_moves_bookkeeping_exactly_as_store_does_and_writes_nothing(make):
    a, b = make(), make()
    before = a.keys.clone()
    for i, n in enumerate([1, 3, 1, 7, 1, 1, 12, 1]):
        first_slot, first_row = a.advance(n)
        k, v = rows(n, i)
        b.store(b.end, k, v)
        assert a.metadata() == b.metadata()
        assert first_slot == b.slot(b.end - n + first_row)
    if a.kind == "ring":
        assert torch.equal(a.keys, before)           # metadata only


def test_advance_lockstep_equals_advancing_each_plane():
    for make in (lambda: ring(3), growing):
        group, alone = [make() for _ in range(4)], [make() for _ in range(4)]
        for step in range(11):                       # rings wrap; growing planes grow 4 -> 8 -> 16
            got = advance_lockstep(group, 1)
            want = {(p.advance(1)[0], p.len) for p in alone}
            assert want == {got}
            assert [p.metadata() for p in group] == [p.metadata() for p in alone]
            if make is growing:
                assert all(p.allocated >= p.len for p in group)


def test_advance_lockstep_under_a_checkpoint_logs_each_plane_and_rolls_back():
    group = [ring(3) for _ in range(3)]
    for i, p in enumerate(group):
        p.store(0, *rows(5, i))
    marks = [p.bookmark() for p in group]
    kept = [p.logical_rows() for p in group]
    cp = Checkpoint(group, 5, 2)
    advance_lockstep(group, 1)
    advance_lockstep(group, 1)
    assert all(len(p.undo.evictions) == 2 for p in group)
    cp.rollback(0)
    for p, mark, (k, v) in zip(group, marks, kept):
        assert p.bookmark() == mark
        lk, lv = p.logical_rows()
        assert torch.equal(lk, k) and torch.equal(lv, v)


def test_advance_refuses_to_evict_its_own_rows_under_a_checkpoint_without_them():
    p = ring(2)
    cp = Checkpoint([p], 0, 5)
    meta = p.metadata()
    with pytest.raises(CheckpointError, match="evict rows of their own chunk"):
        p.advance(5)
    assert p.metadata() == meta and p.undo.stored == 0
    p.store(0, *rows(5))                             # with the rows it can log them
    cp.rollback(3)
    assert p.end == 3


def test_rewind_goes_back_only():
    p = ring(4)
    p.store(0, *rows(6))
    mark = p.bookmark()
    p.advance(3)
    p.rewind(mark)
    assert p.bookmark() == mark
    with pytest.raises(CacheError, match="cannot rewind"):
        p.rewind((4, 9, 0))                          # ahead of the plane
    with pytest.raises(CacheError, match="cannot rewind"):
        p.rewind((5, 0, 0))                          # more rows than the capacity


def test_no_code_outside_plane_py_writes_plane_fields():
    write = re.compile(r"\.(len|origin_logical|origin_physical|undo)\s*(,[^=\n]*)?=(?!=)")
    offenders = []
    for f in (ROOT / "muser").rglob("*.py"):
        if f.relative_to(ROOT).as_posix() == "muser/cache/plane.py":
            continue
        for i, line in enumerate(f.read_text().splitlines(), 1):
            if write.search(line):
                offenders.append(f"{f.relative_to(ROOT)}:{i}: {line.strip()}")
    assert offenders == []


def test_a_growing_plane_counts_its_rows_as_its_storage_has_them():
    """`allocated` is an int field kept beside the storage (a decode step asks it for every plane):
    it follows reserve, store, advance and lockstep growth, and check_invariants catches a drift."""
    lead, other = growing(), growing()
    assert lead.allocated == lead.keys.shape[1] == 0
    lead.store(0, *rows(3))
    other.store(0, *rows(3))
    advance_lockstep([lead, other], 9)               # grows past min_rows: 4 -> 12 or more
    lead.reserve(100)
    for p in (lead, other):
        assert p.allocated == p.keys.shape[1] == p.values.shape[1] >= p.len == 12
        p.check_invariants()
    lead._allocated += 1
    with pytest.raises(CacheError, match="storage"):
        lead.check_invariants()
