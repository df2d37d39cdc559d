"""Session packs at the plane level: bitwise round trips, the byte layout, versions, keys, the model gate."""
import json
import struct

import pytest
import torch
from packutil import (FINGERPRINT, fill, make_planes, plane_state, reseal, same_state, split,
                      synthetic_snapshot)
from safetensors.torch import load as st_load

import muser
from muser.attention.reference import attention, visibility_mask
from muser.cache import Encoding
from muser.cache import snapshot as cut
from muser.errors import (EncodingMismatch, PackAuthError, PackEncodingMismatch, PackError,
                          PackIntegrityError, PackModelMismatch, PackShapeError, PackVersionError,
                          SnapshotShapeError)
from muser.pack import format as pf
from muser.pack import reader as pr
from muser.env import read as read_env
from muser.pack.manifest import check_model, load_key

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def attend_all(planes, position, seed=1):
    """Attention of one query at `position - 1` over each plane's rows in physical order."""
    g = torch.Generator().manual_seed(seed)
    outs = []
    for p in planes:
        q = torch.randn(1, 4, p.head_dim, generator=g).to(p.dtype)
        if p.kind == "ring":
            k, v = p.keys[:p.len], p.values[:p.len]
            pos = torch.tensor([p.origin_logical + ((s - p.origin_physical) % p.capacity) for s in range(p.len)])
        else:
            k, v = p.keys[:, :p.len].transpose(0, 1), p.values[:, :p.len].transpose(0, 1)
            pos = torch.arange(p.len)
        mask = visibility_mask(torch.tensor([position - 1]), pos, p.window)
        outs.append(attention(q, k, v, mask, 0.25))
    return outs


@pytest.mark.parametrize("family", ["ring", "oracle"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_is_bitwise_before_at_and_after_wraps(family, dtype, tmp_path):
    live = make_planes(family, dtype=dtype)
    enc = Encoding(family, str(dtype).removeprefix("torch."))
    for position in [0, 1, 3, 4, 5, 7, 8, 9, 12, 13, 17]:          # window 4: wraps at 4, 8, 12, 16
        fill(live, position)
        snap = cut.take(live, position, enc, tokens=tuple(range(position)), model=FINGERPRINT)
        path = tmp_path / f"p{position}.pack"
        pf.save_pack(snap, path)
        for loaded in (pr.load_pack(path), pr.pack_from_bytes(pf.pack_to_bytes(snap))):
            assert loaded.equal(snap) and loaded.tokens == snap.tokens and loaded.model == FINGERPRINT
            restored = make_planes(family, dtype=dtype)
            cut.install(loaded, restored, enc)
            assert same_state(plane_state(restored), plane_state(live))
            if position:
                assert all(torch.equal(a, b) for a, b in
                           zip(attend_all(restored, position), attend_all(live, position)))
            fill(restored, position + 6)                      # continue across the next wrap
            twin = make_planes(family, dtype=dtype)
            fill(twin, position + 6)
            assert same_state(plane_state(restored), plane_state(twin))


def test_growing_plane_installs_into_storage_of_another_capacity():
    snap, live = synthetic_snapshot(position=37, family="oracle", max_context=64)
    data = pf.pack_to_bytes(snap)
    bigger = make_planes("oracle", max_context=512)
    for p in bigger:
        p.reserve(300)                                   # a different allocation, too
    cut.install(pr.pack_from_bytes(data), bigger, snap.encoding)
    for a, b in zip(bigger, live):
        assert a.allocated != b.allocated and a.capacity != b.capacity
        assert torch.equal(a.keys[:, :37], b.keys[:, :37]) and torch.equal(a.values[:, :37], b.values[:, :37])
    fill(bigger, 50)
    fill(live, 50)
    assert all(torch.equal(a.keys[:, :50], b.keys[:, :50]) for a, b in zip(bigger, live))
    assert pr.pack_from_bytes(data).equal(snap)


def test_byte_layout_is_what_the_docstring_says(snap):
    data = pf.pack_to_bytes(snap)
    n, header, manifest, seal, rest = split(data)
    assert (8 + n) % 8 == 0 and data[8 + n - 1:8 + n] in (b" ", b"}")
    assert len(data) == 8 + n + sum(2 * p["keys"]["length"] for p in manifest["planes"])
    assert set(header) == {"__metadata__", "L0000.k", "L0000.v", "L0001.k", "L0001.v", "L0002.k", "L0002.v"}
    assert manifest["format"] == "muser.pack" and manifest["version"] == "1.0"
    assert manifest["position"] == 11 and manifest["tokens"] == list(range(100, 111))
    assert seal["hmac"] == "" and len(seal["sha256"]) == 64
    offset = 0
    for cutp, p in zip(snap.planes, manifest["planes"]):
        assert (p["layer"], p["kind"], p["start"], p["count"]) == (cutp.layer, cutp.kind, cutp.start, cutp.count)
        for which, t in (("keys", cutp.keys), ("values", cutp.values)):
            e = p[which]
            assert e["offset"] == offset and header[f"L{p['layer']:04d}.{which[0]}"]["data_offsets"] == \
                [offset, offset + e["length"]]
            assert rest[offset:offset + e["length"]] == t.contiguous().numpy().tobytes()   # logical order
            offset += e["length"]
    # any safetensors reader gets the same tensors
    tensors = st_load(data)
    assert torch.equal(tensors["L0001.k"], snap.planes[1].keys)


def test_minor_version_with_optional_fields_loads(snap):
    def newer(m):
        m["version"] = "1.7"
        m["compression"] = None
        m["planes"][0]["note"] = {"future": True}
    loaded = pr.pack_from_bytes(reseal(pf.pack_to_bytes(snap), newer))
    assert loaded.equal(snap)


@pytest.mark.parametrize("version", ["2.0", "0.9", "13.1"])
def test_unknown_major_version_is_refused_naming_both(snap, version):
    data = reseal(pf.pack_to_bytes(snap), lambda m: m.update(version=version))
    with pytest.raises(PackVersionError) as e:
        pr.pack_from_bytes(data)
    assert version in str(e.value) and "1.x" in str(e.value)


def test_keys_sign_verify_and_refuse(snap, tmp_path):
    path = tmp_path / "s.pack"
    pf.save_pack(snap, path, key=b"secret")
    loaded, state = pr.verify(path, key=b"secret")
    assert loaded.equal(snap) and state.startswith("authenticated")
    _, state = pr.verify(path)                                     # no key: integrity only, and says so
    assert "NOT verified" in state
    with pytest.raises(PackAuthError, match="another key"):
        pr.load_pack(path, key=b"wrong")
    pf.save_pack(snap, tmp_path / "u.pack")
    with pytest.raises(PackAuthError, match="unsigned"):
        pr.load_pack(tmp_path / "u.pack", key=b"secret")
    assert "unsigned: integrity only" == pr.verify(tmp_path / "u.pack")[1]
    with pytest.raises(PackAuthError):
        pf.pack_to_bytes(snap, key=b"")


def test_forgery_without_the_key_is_refused_by_a_key_holder(snap):
    """A forger can recompute digests and the SHA-256 seal, but not the HMAC."""
    signed = pf.pack_to_bytes(snap, key=b"k1")
    forged = reseal(signed, lambda m: m.update(position=m["position"]))   # re-sealed, unsigned
    with pytest.raises(PackAuthError):
        pr.pack_from_bytes(forged, key=b"k1")
    forged = reseal(signed, lambda m: m["tokens"].__setitem__(0, 7), key=b"k2")
    with pytest.raises(PackAuthError):
        pr.pack_from_bytes(forged, key=b"k1")


def test_load_key_sources(tmp_path):
    f = tmp_path / "key"
    f.write_bytes(b"s3cret\n")
    assert load_key(str(f)) == b"s3cret"
    f.write_bytes(b"\x00\x0a bin \n\n")
    assert load_key(str(f)) == b"\x00\x0a bin \n"
    assert load_key(None, env=read_env({"MUSER_PACK_KEY": "abc"})) == b"abc"
    assert load_key(None, env=read_env({})) is None
    f.write_bytes(b"\n")
    with pytest.raises(PackAuthError, match="empty"):
        load_key(str(f))


def test_check_model_names_the_field():
    other = json.loads(json.dumps(FINGERPRINT))
    check_model(FINGERPRINT, other)
    other["layers"][1][1] = 8
    with pytest.raises(PackModelMismatch, match="window of layer 1 expected 8, got 4"):
        check_model(FINGERPRINT, other)
    other = dict(FINGERPRINT, weights_digest="cd" * 32)
    with pytest.raises(PackModelMismatch, match=r"weights digest expected cdcd.*, got abab"):
        check_model(FINGERPRINT, other)
    with pytest.raises(PackModelMismatch, match="kv_heads expected 4, got 2"):
        check_model(FINGERPRINT, dict(FINGERPRINT, kv_heads=4))
    with pytest.raises(PackModelMismatch, match="layer count expected 2, got 3"):
        check_model(FINGERPRINT, dict(FINGERPRINT, layers=FINGERPRINT["layers"][:2]))
    with pytest.raises(PackModelMismatch, match="without one"):
        check_model({}, FINGERPRINT)


def test_load_gates_model_and_encoding(snap):
    data = pf.pack_to_bytes(snap)
    assert pr.pack_from_bytes(data, expect_model=FINGERPRINT, expect_encoding=snap.encoding).equal(snap)
    with pytest.raises(PackModelMismatch, match="rope of layer 2 expected False, got True"):
        pr.pack_from_bytes(data, expect_model=dict(FINGERPRINT, layers=[["sliding", 4, True],
                                                                        ["sliding", 4, True], ["full", None, False]]))
    with pytest.raises(PackEncodingMismatch) as e:
        pr.pack_from_bytes(data, expect_encoding=Encoding("oracle", "float32"))
    assert isinstance(e.value, EncodingMismatch) and "oracle/float32" in str(e.value)


def test_shape_gate_refuses_another_window_and_another_encoding():
    snap, _ = synthetic_snapshot(position=9, model={})
    loaded = pr.pack_from_bytes(pf.pack_to_bytes(snap))
    target = make_planes("ring", window=8)
    before = plane_state(target)
    with pytest.raises(SnapshotShapeError, match="window"):
        cut.install(loaded, target, snap.encoding)
    with pytest.raises(EncodingMismatch):
        cut.install(loaded, make_planes("oracle"), Encoding("oracle", "float32"))
    assert same_state(plane_state(target), before)


def test_save_refuses_an_inconsistent_snapshot(snap):
    bad = cut.SessionSnapshot(snap.position, Encoding("ring", "bfloat16"), snap.planes, snap.tokens)
    with pytest.raises(PackShapeError, match="dtype"):
        pf.pack_to_bytes(bad)
    p0 = snap.planes[0]
    short = cut.PlaneCut(p0.layer, p0.kind, p0.window, p0.start, p0.count, p0.keys, p0.values[:-1])
    with pytest.raises(PackShapeError, match="shape"):
        pf.pack_to_bytes(cut.SessionSnapshot(snap.position, snap.encoding, (short,) + snap.planes[1:]))
    with pytest.raises(PackError):                    # a plane that does not end at `position`
        pf.pack_to_bytes(cut.SessionSnapshot(snap.position + 1, snap.encoding, snap.planes))


def test_read_manifest_is_header_only(snap):
    data = bytearray(pf.pack_to_bytes(snap))
    data[-1] ^= 1                                    # a data byte: read_manifest does not hash data
    info = pr.read_manifest(bytes(data))
    assert info["manifest"]["position"] == 11 and info["file_bytes"] == len(data)
    with pytest.raises(PackIntegrityError, match="sha256"):
        pr.pack_from_bytes(bytes(data))
    assert struct.unpack("<Q", bytes(data[:8]))[0] == info["header_bytes"]
