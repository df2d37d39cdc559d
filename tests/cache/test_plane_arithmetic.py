"""Worked examples of the append arithmetic, and fail-closed refusals."""
import pytest
import torch

from muser.cache import GrowingPlane, RingPlane, plan, CacheGeometry
from muser.errors import CacheDiscontinuity, CacheOverflow, CacheError


def ring(capacity, max_context=1 << 20, kv=1, d=2):
    return RingPlane(0, capacity, max_context, kv, d, torch.float32, "cpu")


def fill(plane, n):
    plane.append_batch(plane.end, n)


@pytest.mark.parametrize(
    "capacity, len0, chunk, expect_pair, expect_ol, expect_op, expect_len",
    [
        (2048, 1900, 512, (0, 512), 364, 364, 2048),      # the chapter's wrap case
        (2048, 2048, 512, (0, 512), 512, 512, 2048),      # steady state (first wrap of a full ring)
        (2048, 100, 512, (0, 512), 0, 0, 612),            # still filling
        (4, 0, 6, (2, 4), 2, 2, 4),                        # chunk wider than the ring loses its head
        (4, 3, 9, (5, 4), 8, 0, 4),                        # wider again, from a partial ring
        (5, 5, 1, (0, 1), 1, 1, 5),                        # single-token eviction
    ],
)
def test_append_batch_worked_examples(capacity, len0, chunk, expect_pair, expect_ol, expect_op, expect_len):
    p = ring(capacity)
    fill(p, len0)
    assert p.append_batch(len0, chunk) == expect_pair
    assert (p.origin_logical, p.origin_physical, p.len) == (expect_ol, expect_op, expect_len)
    p.check_invariants()


def test_steady_state_keeps_rotating():
    p = ring(2048)
    fill(p, 2048)
    for i in range(1, 6):
        assert p.append_batch(p.end, 512) == (0, 512)
        assert p.origin_logical == 512 * i and p.origin_physical == (512 * i) % 2048


def test_growing_plane_never_wraps():
    p = GrowingPlane(3, 100, 1, 2, torch.float32, "cpu")
    for n in (7, 50, 43):
        assert p.append_batch(p.end, n) == (0, n)
        assert p.origin_logical == 0 and p.origin_physical == 0
        p.check_invariants()
    assert p.len == 100


def test_growing_plane_overflow_is_typed_and_changes_nothing():
    p = GrowingPlane(3, 10, 1, 2, torch.float32, "cpu")
    p.store(0, torch.ones(8, 1, 2), torch.ones(8, 1, 2))
    before = (p.len, p.origin_logical, p.origin_physical, p.keys.clone())
    with pytest.raises(CacheOverflow) as e:
        p.store(8, torch.ones(3, 1, 2), torch.ones(3, 1, 2))
    assert e.value.layer == 3 and e.value.max_context == 10 and e.value.requested == 11
    assert (p.len, p.origin_logical, p.origin_physical) == before[:3]
    assert torch.equal(p.keys, before[3])


@pytest.mark.parametrize("make", [lambda: ring(4), lambda: GrowingPlane(0, 64, 1, 2, torch.float32, "cpu")])
@pytest.mark.parametrize("offset", [-1, 1, 5])
def test_discontinuous_append_is_refused_before_any_write(make, offset):
    p = make()
    p.store(0, torch.randn(6 if p.kind == "growing" else 3, 1, 2), torch.randn(6 if p.kind == "growing" else 3, 1, 2))
    snapshot = (p.metadata(), p.keys.clone(), p.values.clone())
    with pytest.raises(CacheDiscontinuity) as e:
        p.store(p.end + offset, torch.randn(2, 1, 2), torch.randn(2, 1, 2))
    assert (e.value.layer, e.value.expected, e.value.got) == (0, p.end, p.end + offset)
    assert str(p.end) in str(e.value) and str(p.end + offset) in str(e.value) and "layer 0" in str(e.value)
    assert p.metadata() == snapshot[0]
    assert torch.equal(p.keys, snapshot[1]) and torch.equal(p.values, snapshot[2])


def test_wrong_row_shape_is_refused_before_any_write():
    p = ring(4)
    with pytest.raises(CacheError):
        p.store(0, torch.randn(2, 2, 2), torch.randn(2, 2, 2))
    assert p.len == 0


def test_ring_capacity_is_min_of_context_and_window():
    assert ring(2048, max_context=512).capacity == 512
    assert ring(512, max_context=32768).capacity == 512


def test_ring_refuses_positions_past_max_context():
    p = ring(4, max_context=6)
    p.store(0, torch.randn(6, 1, 2), torch.randn(6, 1, 2))
    with pytest.raises(CacheOverflow):
        p.store(6, torch.randn(1, 1, 2), torch.randn(1, 1, 2))


def test_cost_curves_match_the_chapter():
    g = CacheGeometry((2048,) * 39 + (None,) * 13, kv_heads=1, head_dim=256, dtype_bytes=2, max_context=131072)
    assert plan(g, 131072).sliding_bytes == 81_788_928
    assert plan(g, 131072).full_bytes == 1_744_830_464
    assert plan(g, 2048).sliding_bytes == plan(g, 100_000).sliding_bytes == 81_788_928
    assert plan(g, 1000).sliding_bytes == 39 * 1000 * 1024
