"""`muser pack inspect | verify | save`: exit statuses, reasons, keys from a file or the environment."""
import json

import pytest
from packutil import synthetic_snapshot

from muser.cli import main as cli
from muser.pack import format as pf
from muser.pack import reader as pr


@pytest.fixture
def packs(tmp_path):
    snap, _ = synthetic_snapshot(position=9)
    key = tmp_path / "key"
    key.write_bytes(b"cli-secret\n")
    pf.save_pack(snap, tmp_path / "signed.pack", key=b"cli-secret")
    pf.save_pack(snap, tmp_path / "plain.pack")
    bad = bytearray((tmp_path / "plain.pack").read_bytes())
    bad[-3] ^= 0x10
    (tmp_path / "bad.pack").write_bytes(bytes(bad))
    return tmp_path, key


def test_verify_exit_status_and_reason(packs, capsys, monkeypatch):
    d, key = packs
    monkeypatch.delenv("MUSER_PACK_KEY", raising=False)
    assert cli(["pack", "verify", str(d / "signed.pack"), "--key-file", str(key)]) == 0
    assert "authenticated: HMAC-SHA256 verified" in capsys.readouterr().out
    assert cli(["pack", "verify", str(d / "plain.pack")]) == 0
    assert "unsigned: integrity only" in capsys.readouterr().out
    assert cli(["pack", "verify", str(d / "bad.pack")]) == 1
    err = capsys.readouterr().err
    assert "PackIntegrityError" in err and "sha256 expected" in err
    assert cli(["pack", "verify", str(d / "plain.pack"), "--key-file", str(key)]) == 1
    assert "PackAuthError" in capsys.readouterr().err
    monkeypatch.setenv("MUSER_PACK_KEY", "wrong")
    assert cli(["pack", "verify", str(d / "signed.pack")]) == 1
    assert "another key" in capsys.readouterr().err
    monkeypatch.setenv("MUSER_PACK_KEY", "cli-secret")
    assert cli(["pack", "verify", str(d / "signed.pack")]) == 0
    assert cli(["pack", "verify", str(d / "missing.pack")]) == 1


def test_inspect_table_and_json(packs, capsys, monkeypatch):
    d, _ = packs
    monkeypatch.delenv("MUSER_PACK_KEY", raising=False)
    assert cli(["pack", "inspect", str(d / "signed.pack")]) == 0
    out = capsys.readouterr().out
    assert "muser.pack 1.0" in out and "ring/float32" in out and "NOT verified" in out
    assert cli(["pack", "inspect", "--json", str(d / "plain.pack")]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["manifest"]["position"] == 9 and info["auth"] == "unsigned: integrity only"
    assert [p["layer"] for p in info["manifest"]["planes"]] == [0, 1, 2]
    (d / "junk.pack").write_bytes(b"not a pack at all")
    assert cli(["pack", "inspect", str(d / "junk.pack")]) == 1
    assert "PackIntegrityError" in capsys.readouterr().err


def test_save_prefills_and_writes_a_loadable_pack(tiny_engine, tmp_path, capsys, monkeypatch):
    from muser.testing import tiny_model_dir
    import muser
    engine = tiny_engine()
    model = str(tiny_model_dir("gemma3"))
    monkeypatch.delenv("MUSER_PACK_KEY", raising=False)
    key = tmp_path / "key"
    key.write_bytes(b"k")
    out = tmp_path / "s.pack"
    text = engine.has_tokenizer                      # --prompt needs tokenizer files; --ids never does
    src = ["--prompt", "hello world"] if text else ["--ids", "5,6,7,8,9,10"]
    assert cli(["pack", "save", *src, "--out", str(out), "--model", model, "--dtype", "float32",
                "--key-file", str(key)]) == 0
    assert "signed with HMAC-SHA256" in capsys.readouterr().out
    snap = pr.load_pack(out, key=b"k")
    want = tuple(engine.encode_prompt("hello world")) if text else (5, 6, 7, 8, 9, 10)
    assert snap.tokens == want and snap.position == len(want) and snap.model == engine.fingerprint
