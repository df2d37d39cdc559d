"""Slot save / restore through the pack format: a conversation survives a restart."""
from __future__ import annotations

import pytest

from server_harness import serve
from test_server_shift import conversation


def test_save_restart_restore_continues_from_cache(tiny, tmp_path):
    prompt = [2] + list(range(20, 70))
    with serve(tiny, model_id="tiny", slots=2, session_dir=str(tmp_path), output_reserve=32) as a:
        r = a.client().completions.create(model="tiny", prompt=prompt, max_tokens=1, temperature=0)
        sid = r.model_extra["muser"]["slot"]
        saved = a.state.pool.slots[sid].session.snapshot()
        out = a.http().post(f"/v1/slots/{sid}/save", json={"filename": "conv-1.pack"})
        assert out.status_code == 200, out.text
        assert out.json()["position"] == len(prompt) and (tmp_path / "conv-1.pack").is_file()
    with serve(tiny, model_id="tiny", slots=2, session_dir=str(tmp_path), output_reserve=32) as b:
        back = b.http().post("/v1/slots/1/restore", json={"filename": "conv-1.pack"})
        assert back.status_code == 200, back.text
        assert b.state.pool.slots[1].session.snapshot().equal(saved)
        r2 = b.client().completions.create(model="tiny", prompt=prompt + [5, 6], max_tokens=1,
                                           temperature=0)
        assert r2.model_extra["muser"]["slot"] == 1
        assert r2.usage.prompt_tokens_details.cached_tokens == len(prompt)


def test_shifted_chat_lineage_survives_restart(tiny, tmp_path):
    cfg = dict(model_id="tiny", slots=1, session_dir=str(tmp_path), max_context=160,
               output_reserve=24)
    msgs = conversation(8)
    with serve(tiny, **cfg) as a:
        r = a.client().chat.completions.create(model="tiny", messages=msgs, max_tokens=1,
                                               temperature=0)
        assert r.model_extra["muser"]["shifted"]
        assert a.http().post("/v1/slots/0/save").status_code == 200        # default slot-0.pack
    with serve(tiny, **cfg) as b:
        back = b.http().post("/v1/slots/0/restore").json()
        assert back["context_epoch"] == 1
        nxt = msgs + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
        r2 = b.client().chat.completions.create(model="tiny", messages=nxt, max_tokens=1)
        e2 = r2.model_extra["muser"]
        assert e2["shifted"] is False and e2["context_epoch"] == 1
        assert r2.usage.prompt_tokens_details.cached_tokens == r.usage.prompt_tokens


@pytest.mark.parametrize("name", ["../evil.pack", "a/b.pack", ".hidden", "x" * 200, "", "..",
                                  "c:\\x", "ok\n.pack", "ok.pack\n"])
def test_file_names_are_validated(tiny, tmp_path, name):
    with serve(tiny, model_id="tiny", slots=1, session_dir=str(tmp_path / "s"),
               output_reserve=32) as s:
        for op in ("save", "restore"):
            r = s.http().post(f"/v1/slots/0/{op}", json={"filename": name})
            assert r.status_code == 400 and r.json()["error"]["param"] == "filename", r.text
        assert not (tmp_path / "evil.pack").exists()


def test_bad_or_missing_pack_is_refused_and_slot_kept(tiny, tmp_path):
    with serve(tiny, model_id="tiny", slots=1, session_dir=str(tmp_path), output_reserve=32) as s:
        s.client().completions.create(model="tiny", prompt=[2, 30, 31, 32], max_tokens=1)
        before = s.state.pool.slots[0].session.snapshot()
        assert s.http().post("/v1/slots/0/restore", json={"filename": "nope.pack"}).status_code == 404
        (tmp_path / "junk.pack").write_bytes(b"\x00" * 64)
        r = s.http().post("/v1/slots/0/restore", json={"filename": "junk.pack"})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
        assert s.state.pool.slots[0].session.snapshot().equal(before)
        assert s.http().get("/health").json()["status"] == "healthy"
