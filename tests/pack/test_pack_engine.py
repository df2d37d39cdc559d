"""Session packs through the engine: save at every wrap phase, load (here and in a fresh
process), continue with bitwise-equal logits; and every foreign pack refused with its own error."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from packutil import plane_state, same_state

import muser
from muser.errors import EncodingMismatch, PackAuthError, PackEncodingMismatch, PackModelMismatch
from muser.pack import format as pf
from muser.pack import reader as pr

POSITIONS = [1, 3, 4, 5, 8, 9, 13, 17]            # tiny model: window 4, wraps at 4, 8, ...


def ids_for(engine, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, engine.spec.vocab_size, (n,), generator=g).tolist()


@pytest.mark.parametrize("backend", ["ring", "oracle"])
def test_restored_session_continues_bitwise_at_every_wrap_phase(tiny_engine, backend, tmp_path):
    engine = tiny_engine(backend=backend)
    ids = ids_for(engine, 40)
    live = engine.new_session()
    live.prefill(ids[:1])
    logits, packs = {}, {}
    for p in range(1, max(POSITIONS) + 3):
        if p in POSITIONS:
            packs[p] = pf.pack_to_bytes(live.snapshot())
        logits[p] = live.decode(ids[p])                  # logits after consuming position p
    for p, data in packs.items():
        s = engine.restore(pr.pack_from_bytes(data))
        assert s.position == p and s.tokens == ids[:p]
        for q in range(p, p + 3):
            assert torch.equal(s.decode(ids[q]), logits[q]), f"{backend}: pack at {p}, step {q}"


@pytest.mark.parametrize("p", [4, 9])
def test_restored_session_prefills_chunks_bitwise(tiny_engine, p, tmp_path):
    engine = tiny_engine()
    ids = ids_for(engine, 40, seed=p)
    a = engine.new_session()
    a.prefill(ids[:p], chunk_size=5)
    pf.save_pack(a.snapshot(), tmp_path / "a.pack", key=b"k")
    b = engine.restore(pr.load_pack(tmp_path / "a.pack", key=b"k"))
    assert same_state(plane_state(b.planes), plane_state(a.planes))
    assert torch.equal(a.prefill(ids[p:p + 7], chunk_size=3), b.prefill(ids[p:p + 7], chunk_size=3))
    assert torch.equal(a.extend(ids[p + 7:p + 10]), b.extend(ids[p + 7:p + 10]))


FRESH = textwrap.dedent("""
    import sys, torch, muser
    from muser.pack import reader as pr
    from muser.pack.manifest import load_key
    engine = muser.load(sys.argv[1], backend="ring", dtype="float32")
    expected = torch.load(sys.argv[2])
    for path, (ids, logits) in expected.items():
        s = engine.restore(pr.load_pack(path, key=load_key()))
        got = torch.stack([s.decode(t) for t in ids])
        assert torch.equal(got, logits), path
        print("OK", path)
""")


def test_pack_loads_in_a_fresh_process_and_continues_bitwise(tiny_engine, tmp_path):
    from muser.testing import tiny_model_dir
    engine = tiny_engine()
    ids = ids_for(engine, 30, seed=5)
    expected = {}
    for p in (2, 4, 6, 13):
        s = engine.new_session()
        s.prefill(ids[:p])
        path = str(tmp_path / f"s{p}.pack")
        pf.save_pack(s.snapshot(), path, key=b"shared-secret")
        cont = ids[p:p + 4]
        expected[path] = (cont, torch.stack([s.decode(t) for t in cont]))
    torch.save(expected, tmp_path / "expected.pt")
    env = dict(os.environ, MUSER_PACK_KEY="shared-secret")
    r = subprocess.run([sys.executable, "-c", FRESH, str(tiny_model_dir("gemma3")), str(tmp_path / "expected.pt")],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("OK") == 4


def refused(engine, snap, error):
    """engine.restore(snap) into a used session raises `error` and leaves that session untouched."""
    s = engine.new_session()
    s.prefill([5, 6, 7])
    before, tokens = plane_state(s.planes), list(s.tokens)
    with pytest.raises(error) as e:
        engine.restore(snap, into=s)
    assert same_state(plane_state(s.planes), before) and s.tokens == tokens
    return e.value


def test_foreign_packs_are_refused_each_with_its_own_error(tiny_engine, tmp_path):
    ring = tiny_engine()
    s = ring.new_session()
    s.prefill(ids_for(ring, 9))
    path = tmp_path / "ring.pack"
    pf.save_pack(s.snapshot(), path, key=b"k")

    with pytest.raises(PackAuthError, match="another key"):
        pr.load_pack(path, key=b"not-k")
    pf.save_pack(s.snapshot(), tmp_path / "plain.pack")
    with pytest.raises(PackAuthError, match="unsigned"):
        pr.load_pack(tmp_path / "plain.pack", key=b"k")

    snap = pr.load_pack(path, key=b"k")
    other = tiny_engine(seed=1)                                   # same shapes, other weights
    refused(other, snap, PackModelMismatch)
    with pytest.raises(PackModelMismatch, match="weights digest expected"):
        pr.load_pack(path, key=b"k", expect_model=other.fingerprint)

    wide = tiny_engine(window=8)                                  # another window
    refused(wide, snap, PackModelMismatch)
    with pytest.raises(PackModelMismatch, match="window of layer 0 expected 8, got 4"):
        pr.load_pack(path, expect_model=wide.fingerprint)

    oracle = tiny_engine(backend="oracle")                        # same model, other encoding
    refused(oracle, snap, EncodingMismatch)
    with pytest.raises(PackEncodingMismatch, match="expected oracle/float32, got ring/float32"):
        pr.load_pack(path, expect_model=oracle.fingerprint, expect_encoding=oracle.encoding)
    o = oracle.new_session()
    o.prefill(ids_for(oracle, 9))
    back = pr.pack_from_bytes(pf.pack_to_bytes(o.snapshot()))
    refused(ring, back, EncodingMismatch)                         # and the reverse
    assert snap.model == ring.fingerprint
    ring.restore(snap)                                            # the right one still installs


def test_bfloat16_session_round_trips(tiny_engine):
    engine = tiny_engine(dtype="bfloat16")
    ids = ids_for(engine, 20, seed=3)
    s = engine.new_session()
    s.prefill(ids[:9])
    data = pf.pack_to_bytes(s.snapshot())
    assert pr.read_manifest(data)["manifest"]["encoding"] == {"family": "ring", "dtype": "bfloat16"}
    r = engine.restore(pr.pack_from_bytes(data))
    assert torch.equal(s.decode(ids[9]), r.decode(ids[9]))


def test_pack_restores_into_an_engine_with_another_max_context(tiny_engine):
    """Growing planes relocate into storage of another capacity; logits stay bitwise equal."""
    from muser.testing import tiny_model_dir
    engine = tiny_engine()
    small = muser.load(str(tiny_model_dir("gemma3")), backend="ring", dtype="float32", max_context=40, progress=False)
    assert small.max_context != engine.max_context and small.fingerprint == engine.fingerprint
    ids = ids_for(engine, 30, seed=11)
    s = engine.new_session()
    s.prefill(ids[:21])
    r = small.restore(pr.pack_from_bytes(pf.pack_to_bytes(s.snapshot())))
    growing = [p for p in r.planes if p.kind == "growing"]
    assert growing and all(p.capacity == 40 != q.capacity for p, q in zip(growing, s.planes[2::3]))
    for t in ids[21:25]:
        assert torch.equal(s.decode(t), r.decode(t))


def test_a_pack_without_lineage_round_trips_through_a_session(tiny_engine):
    import dataclasses
    engine = tiny_engine()
    s = engine.new_session()
    s.prefill(ids_for(engine, 6, seed=2))
    bare = dataclasses.replace(s.snapshot(), tokens=())
    r = engine.restore(pr.pack_from_bytes(pf.pack_to_bytes(bare)))
    again = pr.pack_from_bytes(pf.pack_to_bytes(r.snapshot()))     # unknown ids travel as -1
    assert again.equal(bare) and set(again.tokens) <= {-1}
