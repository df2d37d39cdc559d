"""Restore rebuilds the rotation byte for byte; staged chunks attend exactly like a full-history reference."""
import pytest
import torch

from muser.attention.reference import attention, visibility_mask
from muser.cache import Encoding, GrowingPlane, RingPlane, build_planes, stage
from muser.cache import snapshot as snap_mod
from muser.config import LayerSpec
from muser.errors import EncodingMismatch, SnapshotShapeError


@pytest.mark.parametrize("capacity", [1, 3, 8])
@pytest.mark.parametrize("chunk", [1, 3, 5])
def test_restored_ring_is_byte_identical_at_every_wrap_phase(capacity, chunk):
    live = RingPlane(0, capacity, 100, 2, 4, torch.float32, "cpu")
    g = torch.Generator().manual_seed(capacity * 10 + chunk)
    while live.end + chunk <= 60:
        live.store(live.end, torch.randn(chunk, 2, 4, generator=g), torch.randn(chunk, 2, 4, generator=g))
        k, v = live.logical_rows()
        restored = RingPlane(0, capacity, 100, 2, 4, torch.float32, "cpu")
        restored.install(live.origin_logical, k, v)
        assert restored.metadata() == live.metadata()
        assert torch.equal(restored.keys, live.keys) and torch.equal(restored.values, live.values)


def test_restored_growing_plane_relocates_into_other_storage():
    live = GrowingPlane(0, 64, 1, 4, torch.float32, "cpu", min_rows=4)
    live.store(0, torch.randn(37, 1, 4), torch.randn(37, 1, 4))
    k, v = live.logical_rows()
    other = GrowingPlane(0, 64, 1, 4, torch.float32, "cpu", min_rows=64)   # different allocation
    other.install(0, k, v)
    assert other.allocated != live.allocated
    assert torch.equal(other.keys[:, :37], live.keys[:, :37])


def reference_attention(all_k, all_v, q, q_pos, window, scale):
    """Independent reference: every position ever appended, the window as a mask."""
    k_pos = torch.arange(all_k.shape[0])
    return attention(q, all_k, all_v, visibility_mask(q_pos, k_pos, window), scale)


@pytest.mark.parametrize("window", [1, 4, 7])
@pytest.mark.parametrize("kind", ["ring", "oracle"])
def test_staged_chunks_match_full_history_reference(window, kind):
    g = torch.Generator().manual_seed(window)
    H, KV, D = 4, 2, 8
    plane = (RingPlane(0, window, 200, KV, D, torch.float32, "cpu") if kind == "ring"
             else GrowingPlane(0, 200, KV, D, torch.float32, "cpu", window=window))
    all_k = torch.zeros(0, KV, D)
    all_v = torch.zeros(0, KV, D)
    token_by_token = RingPlane(0, window, 200, KV, D, torch.float32, "cpu")
    for chunk in [1, 2, 5, 1, 9, 3, 1, 1, 12, 4, 7]:
        start = plane.end
        k = torch.randn(chunk, KV, D, generator=g)
        v = torch.randn(chunk, KV, D, generator=g)
        q = torch.randn(chunk, H, D, generator=g)
        q_pos = torch.arange(start, start + chunk)
        staged = stage(plane, start, k, v)
        if staged.needs_mask:
            assert staged.ordered
            mask = visibility_mask(q_pos, staged.key_positions(), window)
        else:
            mask = torch.ones(chunk, staged.keys.shape[0], dtype=torch.bool)
        out = attention(q, staged.keys, staged.values, mask, 0.3)
        staged.commit()
        all_k = torch.cat([all_k, k])
        all_v = torch.cat([all_v, v])
        ref = reference_attention(all_k, all_v, q, q_pos, window, 0.3)
        torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
        for j in range(chunk):
            token_by_token.store(start + j, k[j:j + 1], v[j:j + 1])
        if kind == "ring":
            assert plane.metadata() == token_by_token.metadata()
            assert torch.equal(plane.keys, token_by_token.keys)
        plane.check_invariants()


def test_refused_stage_leaves_plane_untouched():
    plane = RingPlane(0, 4, 100, 1, 2, torch.float32, "cpu")
    plane.store(0, torch.randn(4, 1, 2), torch.randn(4, 1, 2))
    before = (plane.metadata(), plane.keys.clone())
    with pytest.raises(Exception):
        stage(plane, 5, torch.randn(2, 1, 2), torch.randn(2, 1, 2))
    assert plane.metadata() == before[0] and torch.equal(plane.keys, before[1])


LAYERS = (LayerSpec(0, "sliding", 3, True), LayerSpec(1, "full", None, True), LayerSpec(2, "sliding", 3, True))


def filled(family, position, dtype=torch.float32):
    planes = build_planes(LAYERS, family, 64, 1, 2, dtype, "cpu")
    for p in planes:
        p.store(0, torch.arange(position * 2.).reshape(position, 1, 2).to(dtype),
                torch.ones(position, 1, 2, dtype=dtype))
    return planes


@pytest.mark.parametrize("position", [0, 2, 3, 10])
def test_cut_contract_row_counts(position):
    s = snap_mod.take(filled("ring", position), position, Encoding("ring", "float32"))
    assert [(c.kind, c.start, c.count) for c in s.planes] == [
        ("ring", position - min(position, 3), min(position, 3)),
        ("growing", 0, position),
        ("ring", position - min(position, 3), min(position, 3)),
    ]
    fresh = build_planes(LAYERS, "ring", 64, 1, 2, torch.float32, "cpu")
    snap_mod.install(s, fresh, Encoding("ring", "float32"))
    assert snap_mod.take(fresh, position, Encoding("ring", "float32")).equal(s)


def test_encodings_refuse_each_other():
    oracle = snap_mod.take(filled("oracle", 5), 5, Encoding("oracle", "float32"))
    ring = build_planes(LAYERS, "ring", 64, 1, 2, torch.float32, "cpu")
    with pytest.raises(EncodingMismatch):
        snap_mod.install(oracle, ring, Encoding("ring", "float32"))
    ring_snap = snap_mod.take(filled("ring", 5), 5, Encoding("ring", "float32"))
    with pytest.raises(EncodingMismatch):
        snap_mod.install(ring_snap, build_planes(LAYERS, "oracle", 64, 1, 2, torch.float32, "cpu"),
                         Encoding("oracle", "float32"))


@pytest.mark.parametrize("field, mutate", [
    ("count", lambda c: dict(count=c.count - 1, keys=c.keys[1:], values=c.values[1:])),
    ("start", lambda c: dict(start=c.start + 1)),
    ("kind", lambda c: dict(kind="growing")),
    ("keys dtype", lambda c: dict(keys=c.keys.half())),
    ("keys shape", lambda c: dict(keys=c.keys.reshape(c.count, 2, 1))),
])
def test_shape_gate_names_layer_field_expected_got(field, mutate):
    import dataclasses
    s = snap_mod.take(filled("ring", 7), 7, Encoding("ring", "float32"))
    bad = dataclasses.replace(s, planes=(s.planes[0], s.planes[1], dataclasses.replace(s.planes[2], **mutate(s.planes[2]))))
    target = filled("ring", 2)
    before = [(p.metadata(), p.keys.clone()) for p in target]
    with pytest.raises(SnapshotShapeError) as e:
        snap_mod.install(bad, target, Encoding("ring", "float32"))
    assert e.value.layer == 2 and e.value.field == field
    assert "layer 2" in str(e.value) and "expected" in str(e.value) and "got" in str(e.value)
    assert [(p.metadata(), p.keys) for p in target][0][0] == before[0][0]
    assert all(torch.equal(p.keys, b[1]) for p, b in zip(target, before))


def test_unmasked_attention_equals_the_reference_with_an_all_true_mask():
    from muser.backends.cpu.attention import cpu_attention
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(1, 4, 8, generator=g), torch.randn(9, 2, 8, generator=g), torch.randn(9, 2, 8, generator=g)
    fast = cpu_attention(q, k, v, None, 0.3, None)
    ref = attention(q, k, v, torch.ones(1, 9, dtype=torch.bool), 0.3)
    torch.testing.assert_close(fast, ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_masked_chunk_attention_on_cpu_equals_the_reference_and_ignores_threads_and_other_rows(window, dtype):
    """Prefill chunks on CPU go through PyTorch's fused attention with the window mask."""
    from muser.attention.reference import visibility_mask
    from muser.backends.cpu.attention import cpu_attention
    g = torch.Generator().manual_seed(1)
    t, s = 80, 120                                          # a prefill-sized chunk (> FUSED_MIN_ROWS)
    q = torch.randn(t, 4, 32, generator=g).to(dtype)
    k, v = torch.randn(s, 2, 32, generator=g).to(dtype), torch.randn(s, 2, 32, generator=g).to(dtype)
    mask = visibility_mask(torch.arange(s - t, s), torch.arange(s), window)
    attend = cpu_attention
    fast = attend(q, k, v, mask, 0.3, None)
    ref = attention(q.double(), k.double(), v.double(), mask, 0.3)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert fast.dtype == dtype and float((fast.double() - ref).abs().max()) < tol
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(attend(q, k, v, mask, 0.3, None), fast)
    finally:
        torch.set_num_threads(threads)
    other = q.clone()
    other[5:] = torch.randn(t - 5, 4, 32, generator=g).to(dtype)     # change the later rows only
    assert torch.equal(attend(other, k, v, mask, 0.3, None)[:5], fast[:5])
