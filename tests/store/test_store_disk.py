"""The disk tier: session packs that survive a restart; every bad file is refused with a typed
error, logged, counted and removed, and the caller recomputes; a full disk degrades to RAM."""
import errno
import logging
import os

import pytest

import muser
from muser.pack.reader import verify
from muser.store import CutStore

from store_ids import BLOCK, ids

KEY = b"store test key"


def session(engine, tokens):
    s = engine.new_session()
    s.prefill(tokens, chunk_size=BLOCK)
    return s


def open_store(engine, path, key=KEY, **kw):
    kw.setdefault("ram_bytes", 1 << 26)
    return CutStore(engine, disk_dir=path, key=key, block_size=BLOCK, **kw)


def files(store, prefix=""):
    return sorted(p for p in store.disk.dir.iterdir() if p.name.startswith(prefix))


@pytest.fixture
def written(f32, tmp_path):
    """A store with two cuts on a shared 24-token stem, flushed to disk and closed."""
    store = open_store(f32, tmp_path)
    stem = ids(24, 1)
    a, b = session(f32, stem + ids(5, 2)), session(f32, stem + ids(13, 3))
    store.put(a)
    store.put(b)
    assert store.flush(30)
    store.close()
    return tmp_path, a, b


def test_cuts_survive_a_restart_bit_for_bit(f32, written):
    path, a, b = written
    store = open_store(f32, path)
    st = store.stats()
    assert st["cuts"] == {"ram": 0, "disk": 2, "total": 2} and st["blocks"]["disk"] == 3 + 1
    for s in (a, b):
        hit = store.longest_prefix(s.tokens + [9], limit=len(s.tokens))
        assert hit.tier == "disk" and hit.position == len(s.tokens)
        t = f32.new_session()
        store.install(t, hit)
        assert t.snapshot().equal(s.snapshot())
    assert store.longest_prefix(a.tokens).tier == "ram"          # promoted
    assert store.stats()["disk_loads"] == 2
    store.check_invariants()


def test_every_file_is_a_session_pack_sealed_with_the_key(f32, written):
    path, _, _ = written
    store = open_store(f32, path)
    for p in files(store):
        snap, state = verify(p, key=KEY, expect_model=f32.fingerprint, expect_encoding=f32.encoding)
        assert state == "authenticated: HMAC-SHA256 verified"


def test_a_store_opened_with_another_key_refuses_and_removes_every_file(f32, written, caplog):
    path, a, _ = written
    with caplog.at_level(logging.WARNING, logger="muser.store"):
        store = open_store(f32, path, key=b"another key")
    st = store.stats()
    assert st["corrupt"] == 6 and st["cuts"]["total"] == 0 and files(store) == []
    assert "refused" in caplog.text and "another key" in caplog.text
    assert store.longest_prefix(a.tokens) is None


def test_a_flipped_bit_is_refused_on_load_and_the_caller_recomputes(f32, written, caplog):
    path, a, b = written
    store = open_store(f32, path)
    shared = files(store, "b-")[0]                 # the stem's first block: both cuts stand on it
    data = bytearray(shared.read_bytes())
    data[-3] ^= 0x10                               # a tensor byte: the header still checks
    shared.write_bytes(bytes(data))
    t = f32.new_session()
    t.prefill(ids(3, 8))
    before = t.snapshot()
    hit = store.longest_prefix(a.tokens)
    with caplog.at_level(logging.WARNING, logger="muser.store"), pytest.raises(muser.StoreCorrupt, match="sha256"):
        store.install(t, hit)
    assert t.snapshot().equal(before)              # nothing installed
    assert not shared.exists() and store.stats()["corrupt"] == 1 and "refused" in caplog.text
    assert store.longest_prefix(b.tokens) is None  # b stood on the same block: gone too
    assert store.stats()["cuts"]["total"] == 0 and files(store) == []
    assert store.install_longest(t, a.tokens) == 0
    store.check_invariants()


@pytest.mark.parametrize("damage", ["truncate", "foreign-model", "foreign-encoding", "garbage", "renamed"])
def test_a_bad_file_found_at_startup_is_refused_counted_and_removed(f32, written, damage):
    from muser.testing import tiny_model
    path, a, b = written
    store = open_store(f32, path)
    target = store.disk.path(store.longest_prefix(a.tokens).cut)     # a's cut file
    store.close()
    if damage == "truncate":
        target.write_bytes(target.read_bytes()[:-100])
    elif damage == "garbage":
        target.write_bytes(os.urandom(4096))
    elif damage == "renamed":
        other = store.disk.path(store.longest_prefix(b.tokens).cut)
        target.unlink()
        other.rename(target)                       # b's cut under a's name
    else:
        kw = {"seed": 1} if damage == "foreign-model" else {"dtype": "bfloat16", "quant": "int8"}
        foreign = tiny_model(window=4, tokenizer=False, **kw)
        theirs = open_store(foreign, path)
        theirs.put(session(foreign, a.tokens))
        theirs.flush(30)
        theirs.close()
        planted = files(theirs, "c-")[0]
        os.replace(planted, target)                # their cut, under our name, in our directory
    store = open_store(f32, path)
    assert store.stats()["corrupt"] >= 1 and not target.exists()
    assert store.longest_prefix(a.tokens) is None
    store.check_invariants()


def test_a_full_disk_degrades_to_the_ram_tier(f32, tmp_path, monkeypatch, caplog):
    import muser.pack.format as pf
    real = pf._write

    def full(snap, key, f, meta=None):
        f.write(b"\0" * 100)
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(pf, "_write", full)
    store = open_store(f32, tmp_path)
    s = session(f32, ids(30, 1))
    with caplog.at_level(logging.WARNING, logger="muser.store"):
        hit = store.put(s)
        assert store.flush(30)
    st = store.stats()
    assert st["disk_degraded"] and st["disk_errors"] == 1 and "No space left" in caplog.text
    assert list(store.disk.dir.iterdir()) == []    # no temporaries, no half files
    t = f32.new_session()
    store.install(t, hit)                          # RAM serves on
    assert t.snapshot().equal(s.snapshot())
    monkeypatch.setattr(pf, "_write", real)
    store.put(session(f32, ids(30, 2)))
    assert store.flush(30) and store.stats()["disk_writes"] == 0   # stays degraded, no retries
    store.check_invariants()


def test_ram_eviction_demotes_to_disk_and_a_hit_promotes_back(f32, tmp_path):
    store = open_store(f32, tmp_path)
    a, b = session(f32, ids(30, 1)), session(f32, ids(30, 2))
    store.put(a)
    store.put(b)
    store.flush(30)
    store.evict()
    st = store.stats()
    assert st["bytes"]["ram"] == 0 and st["cuts"] == {"ram": 0, "disk": 2, "total": 2}
    t = f32.new_session()
    store.install(t, store.longest_prefix(a.tokens))
    assert t.snapshot().equal(a.snapshot()) and store.stats()["cuts"]["ram"] == 1
    store.check_invariants()


def test_the_disk_budget_evicts_files_least_recently_used_first(f32, tmp_path):
    probe = open_store(f32, tmp_path / "probe")
    probe.put(session(f32, ids(24, 0)))
    probe.flush(30)
    one = probe.stats()["bytes"]["disk"]
    store = open_store(f32, tmp_path / "d", disk_bytes=int(2.5 * one))
    for seed in range(5):
        store.put(session(f32, ids(24, seed)))
        store.flush(30)
        assert store.stats()["bytes"]["disk"] <= int(2.5 * one)
    assert store.stats()["cuts"]["disk"] == 2 and store.stats()["evictions"]["disk"] == 3
    assert len(files(store, "c-")) == 2 and len(files(store, "b-")) == 2 * 3
    store.check_invariants()
