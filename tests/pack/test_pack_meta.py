"""The optional `meta` object in a pack's manifest: round trip, sealed by the HMAC, shape-checked."""
import pytest
from packutil import reseal

from muser.errors import PackAuthError, PackIntegrityError
from muser.pack import format as pf
from muser.pack import reader as pr

META = {"kind": "muser.server.slot", "epoch": 2, "replay": {"kind": "raw", "prefix": [2, 7],
                                                           "suffix_start": 9, "epoch": 2}}


def test_meta_round_trips_and_absent_meta_changes_nothing(snap, tmp_path):
    data = pf.pack_to_bytes(snap, key=b"k", meta=META)
    back, state, meta = pr.read_pack(data, key=b"k")
    assert meta == META and back.equal(snap) and state.startswith("authenticated")
    assert pr.read_pack(pf.pack_to_bytes(snap), key=None)[2] is None
    assert pf.pack_to_bytes(snap) == pf.pack_to_bytes(snap, meta=None)       # byte for byte
    path = tmp_path / "m.pack"
    pf.save_pack(snap, path, key=b"k", meta=META)
    with open(path, "rb") as f:                                             # an open file works too
        assert pr.read_pack(f, key=b"k")[2] == META
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_meta_is_sealed_with_the_manifest(snap):
    data = pf.pack_to_bytes(snap, key=b"k", meta=META)
    # one byte of meta flipped in place: the seal's digest no longer matches
    flipped = data.replace(b'\\"epoch\\":2,\\"kind', b'\\"epoch\\":3,\\"kind', 1)
    assert flipped != data
    with pytest.raises(PackIntegrityError):
        pr.read_pack(flipped, key=None)
    # edited and resealed without the key (unsigned, or signed with another key): refused
    for forger_key in (None, b"other"):
        forged = reseal(data, lambda m: m["meta"].update(epoch=9), key=forger_key)
        with pytest.raises(PackAuthError):
            pr.read_pack(forged, key=b"k")


def test_meta_must_be_an_object(snap):
    with pytest.raises(PackIntegrityError):
        pf.pack_to_bytes(snap, meta=["not", "an", "object"])
    data = pf.pack_to_bytes(snap, meta=META)
    bad = reseal(data, lambda m: m.update(meta=[1, 2]))
    with pytest.raises(PackIntegrityError, match="meta"):
        pr.read_pack(bad)

