"""Faults: a failed staging prefill, a client that leaves mid-stream, a failing model step."""
from __future__ import annotations

import json
import socket
import time

import httpx
import openai
import pytest

from server_harness import serve
from test_server_shift import conversation


def test_failed_staging_prefill_leaves_live_session_bitwise_unchanged(tiny):
    with serve(tiny, model_id="tiny", slots=1, max_context=160, output_reserve=24) as srv:
        state = srv.state
        c = srv.client()
        c.completions.create(model="tiny", prompt=[2] + list(range(10, 60)), max_tokens=3)
        slot = state.pool.slots[0]
        before, tokens_before, epoch_before = slot.session.snapshot(), list(slot.tokens), slot.epoch
        staging = state.pool.staging
        real_prefill = staging.prefill
        calls = []

        def failing_prefill(ids, *a, **kw):        # writes half, then the "device" fails
            calls.append(len(ids))
            real_prefill(ids[:len(ids) // 2])
            raise RuntimeError("injected staging failure")
        staging.prefill = failing_prefill
        with pytest.raises(openai.InternalServerError) as e:     # 503
            c.chat.completions.create(model="tiny", messages=conversation(8), max_tokens=1)
        assert e.value.status_code == 503 and "injected staging failure" in e.value.body["message"]
        assert calls, "the shift did go through staging"
        assert slot.session is not staging and slot.tokens == tokens_before
        assert slot.session.snapshot().equal(before) and slot.epoch == epoch_before
        h = srv.http().get("/health")
        assert h.status_code == 503 and "injected staging failure" in h.json()["reason"]
        with pytest.raises(openai.InternalServerError) as e2:
            c.completions.create(model="tiny", prompt="x", max_tokens=1)
        assert e2.value.status_code == 503


def test_staging_not_started_for_a_client_that_left(tiny):
    with serve(tiny, model_id="tiny", slots=1, max_context=160, output_reserve=24) as srv:
        state = srv.state
        state.scheduler.eos = set()                   # the holder must not stop early
        calls = []
        real = state.pool.staging.prefill
        state.pool.staging.prefill = lambda ids, *a, **k: (calls.append(1), real(ids))[1]
        with httpx.Client(base_url=srv.base, timeout=60) as h, h.stream(
                "POST", "/v1/completions",
                json={"model": "tiny", "prompt": "hold", "max_tokens": 150, "stream": True}) as r:
            lines = r.iter_lines()                    # keep it: a dropped iterator closes the stream
            next(lines)                               # the only slot is now busy
            # a shift request queues behind it; its client leaves while it waits
            body = json.dumps({"model": "tiny", "messages": conversation(8), "max_tokens": 1})
            sock = socket.create_connection(("127.0.0.1", srv.port))
            sock.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                          f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
                          f"{body}").encode())
            deadline = time.time() + 20
            while state.pool.queue_depth == 0:
                assert time.time() < deadline, "the shift request never queued"
                time.sleep(0.01)
            sock.close()
            while state.pool.queue_depth:
                assert time.time() < deadline, "the queued request was not dropped"
                time.sleep(0.01)
            assert state.pool.slots[0].busy            # the holder is still generating
        srv.wait_idle()
        assert calls == [] and state.pool.staging.position == 0
        assert srv.http().get("/health").json()["status"] == "healthy"


def test_client_disconnect_mid_stream_frees_the_slot(tiny):
    with serve(tiny, model_id="tiny", slots=1, output_reserve=32) as srv:
        state = srv.state
        state.scheduler.eos = set()
        with httpx.Client(base_url=srv.base, timeout=60) as h:
            with h.stream("POST", "/v1/chat/completions",
                          json={"model": "tiny", "stream": True, "max_tokens": 200, "temperature": 0,
                                "messages": [{"role": "user", "content": "talk"}]}) as r:
                assert r.status_code == 200
                lines = r.iter_lines()
                got = [json.loads(x[6:]) for x in (next(lines), next(lines), next(lines))
                       if x.startswith("data: ")]
                assert got and got[0]["object"] == "chat.completion.chunk"
        t0 = time.time()
        srv.wait_idle(timeout=10)
        assert time.time() - t0 < 5
        slot = state.pool.slots[0]
        prompt_len = len(tiny.tokenizer.apply_chat_template([{"role": "user", "content": "talk"}]))
        assert len(slot.tokens) < prompt_len + 100       # stopped well before 200 tokens
        slot.session.check_invariants()
        m = srv.http().get("/metrics").text
        assert "muser_disconnects_total 1" in m
        # A plain completion: a chat reply may end early at a sampled turn marker.
        ok = srv.client().completions.create(model="tiny", max_tokens=2, prompt="again")
        assert ok.usage.completion_tokens == 2 and ok.choices[0].finish_reason == "length"


@pytest.mark.parametrize("stream", [False, True])
def test_model_step_failure_latches_unhealthy(tiny, stream):
    with serve(tiny, model_id="tiny", slots=2, output_reserve=32) as srv:
        state = srv.state
        c = srv.client()
        c.completions.create(model="tiny", prompt="warm", max_tokens=2)
        boom = RuntimeError("injected decode failure")
        state.scheduler.eos = set()            # a sampled end-of-sequence would need no decode step

        def fail(*a, **k):
            raise boom
        for s in state.pool.slots:
            s.session.decode = fail
        if stream:
            with httpx.Client(base_url=srv.base, timeout=60) as h:
                r = h.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 5,
                                                    "stream": True})
                assert r.status_code == 200          # first token came from the prefill
                events = [json.loads(x[6:]) for x in r.text.splitlines()
                          if x.startswith("data: {")]
                assert "injected decode failure" in events[-1]["error"]["message"]
        else:
            with pytest.raises(openai.InternalServerError) as e:
                c.completions.create(model="tiny", prompt="x", max_tokens=5)
            assert e.value.status_code == 503
        h = srv.http().get("/health")
        assert h.status_code == 503 and h.json()["status"] == "unhealthy"
        assert "injected decode failure" in h.json()["reason"]
        with pytest.raises(openai.InternalServerError) as e:
            c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                      max_tokens=1)
        assert e.value.status_code == 503 and e.value.body["type"] == "service_unavailable"
        assert "muser_healthy 0" in srv.http().get("/metrics").text


def test_busy_staging_is_429_and_live_session_kept(tiny):
    with serve(tiny, model_id="tiny", slots=1, max_context=160, output_reserve=24) as srv:
        state = srv.state
        c = srv.client()
        c.completions.create(model="tiny", prompt=[2, 40, 41, 42], max_tokens=2)
        before = state.pool.slots[0].session.snapshot()
        assert state.pool.staging_lock.acquire(blocking=False)     # another rebuild in progress
        try:
            with pytest.raises(openai.RateLimitError) as e:
                c.chat.completions.create(model="tiny", messages=conversation(8), max_tokens=1)
            assert "staging" in e.value.body["message"]
        finally:
            state.pool.staging_lock.release()
        assert state.pool.slots[0].session.snapshot().equal(before)
        assert srv.http().get("/health").json()["status"] == "healthy"
        r = c.chat.completions.create(model="tiny", messages=conversation(8), max_tokens=1)
        assert r.model_extra["muser"]["shifted"] is True


def test_a_sampler_bug_fails_that_request_alone_never_hangs_it(tiny, monkeypatch):
    import muser.engine.picker as picker          # every token the scheduler takes is sampled here

    def broken(*a, **k):
        raise ValueError("sampler bug")
    with serve(tiny, model_id="tiny", slots=1, output_reserve=32) as srv:
        monkeypatch.setattr(picker, "sample", broken)
        with pytest.raises(openai.InternalServerError) as e:
            srv.client(timeout=30).completions.create(model="tiny", prompt="x", max_tokens=3)
        assert e.value.status_code == 500 and "server stays healthy" in e.value.body["message"]
        assert "sampler bug" not in e.value.body["message"]          # no internals leak
        assert srv.http().get("/health").status_code == 200
        monkeypatch.undo()
        ok = srv.client().completions.create(model="tiny", prompt="x", max_tokens=3, temperature=0)
        assert ok.usage.completion_tokens == 3                      # greedy: no sampled early EOS
        assert 'muser_request_failures_total{stage="first_token"} 1' in srv.http().get("/metrics").text
