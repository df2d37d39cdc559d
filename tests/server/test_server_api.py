"""The HTTP API through the official openai client, on a tiny random model."""
from __future__ import annotations

import openai
import pytest

from server_harness import serve

CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello world"}]


def test_models_and_unknown_model(tiny_server):
    c = tiny_server.client()
    assert [m.id for m in c.models.list().data] == ["tiny"]
    with pytest.raises(openai.NotFoundError) as e:
        c.chat.completions.create(model="gpt-4o", messages=CHAT, max_tokens=2)
    assert e.value.body["code"] == "model_not_found" and "tiny" in e.value.body["message"]


def test_chat_stream_equals_whole(tiny_server):
    c = tiny_server.client()
    whole = c.chat.completions.create(model="tiny", messages=CHAT, max_tokens=6, temperature=0)
    assert whole.object == "chat.completion"
    assert whole.choices[0].message.role == "assistant"
    assert whole.choices[0].finish_reason in ("stop", "length")
    u = whole.usage
    assert u.prompt_tokens > 0 and 0 < u.completion_tokens <= 6
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert u.prompt_tokens_details.cached_tokens == 0
    ext = whole.model_extra["muser"]
    assert ext["shifted"] is False and ext["context_epoch"] == 0
    chunks = list(c.chat.completions.create(model="tiny", messages=CHAT, max_tokens=6,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == u.completion_tokens
    assert chunks[-1].usage.prompt_tokens == u.prompt_tokens
    finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finals == [whole.choices[0].finish_reason]


def test_completions_stream_equals_whole_and_seeded_sampling(tiny_server):
    c = tiny_server.client()
    whole = c.completions.create(model="tiny", prompt="the quick brown", max_tokens=5, temperature=0)
    assert whole.object == "text_completion" and whole.usage.completion_tokens == 5
    text = "".join(ch.choices[0].text for ch in c.completions.create(
        model="tiny", prompt="the quick brown", max_tokens=5, temperature=0, stream=True) if ch.choices)
    assert text == whole.choices[0].text
    a, b = (c.completions.create(model="tiny", prompt=[2, 10, 11], max_tokens=6, temperature=1.0,
                                 top_p=0.9, seed=1234).choices[0].text for _ in range(2))
    assert a == b


def test_stop_string_is_not_emitted(tiny_server):
    c = tiny_server.client()
    full = c.completions.create(model="tiny", prompt="hello", max_tokens=12, temperature=0).choices[0].text
    stop = full[3:5]
    if not stop.strip("\ufffd"):
        pytest.skip("generated text has no usable stop string")
    cut = c.completions.create(model="tiny", prompt="hello", max_tokens=12, temperature=0, stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == full[:full.find(stop)]


def test_cache_reuse_reports_cached_tokens(tiny_server):
    c = tiny_server.client()
    p = [2] + list(range(10, 40))
    first = c.completions.create(model="tiny", prompt=p, max_tokens=1, temperature=0)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    slot = first.model_extra["muser"]["slot"]
    second = c.completions.create(model="tiny", prompt=p + [50, 51], max_tokens=1, temperature=0)
    assert second.model_extra["muser"]["slot"] == slot
    assert second.usage.prompt_tokens_details.cached_tokens == len(p)
    assert second.usage.prompt_tokens == len(p) + 2
    # the continued cache equals a cold prefill of the same tokens, bitwise
    s = tiny_server.state.pool.slots[slot].session
    cold = tiny_server.state.engine.new_session()
    cold.prefill(p + [50, 51])
    assert s.snapshot().equal(cold.snapshot())
    metrics = tiny_server.http().get("/metrics").text
    assert "muser_cache_hits_total 1" in metrics and "muser_cached_tokens_total 31" in metrics


def test_api_key(tiny):
    with serve(tiny, model_id="tiny", slots=1, api_key="s3cret", output_reserve=32) as srv:
        for key in ("wrong", None):
            h = srv.http()
            headers = {"authorization": f"Bearer {key}"} if key else {}
            r = h.post("/v1/chat/completions", headers=headers,
                       json={"model": "tiny", "messages": CHAT, "max_tokens": 1})
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        with pytest.raises(openai.AuthenticationError):
            srv.client(api_key="nope").models.list()
        ok = srv.client(api_key="s3cret").chat.completions.create(model="tiny", messages=CHAT,
                                                                  max_tokens=1)
        assert ok.usage.completion_tokens == 1
        assert srv.http().get("/health").json()["status"] == "healthy"


def test_health_and_metrics(tiny_server):
    h = tiny_server.http()
    r = h.get("/health")
    assert r.status_code == 200 and r.json()["status"] == "healthy" and r.json()["slots"] == 4
    tiny_server.client().completions.create(model="tiny", prompt="abc", max_tokens=2)
    m = h.get("/metrics")
    assert m.status_code == 200 and m.headers["content-type"].startswith("text/plain")
    for name in ("muser_requests_total", "muser_completion_tokens_total", "muser_cache_hits_total",
                 "muser_context_shifts_total", "muser_slots_busy", "muser_queue_wait_seconds_count",
                 "muser_prefill_seconds_sum", "muser_decode_seconds_count", "muser_ttft_seconds_sum"):
        assert name in m.text, name
    assert 'muser_requests_total{endpoint="completions",status="200"} 1' in m.text


def test_errors_are_counted(tiny_server):
    h = tiny_server.http()
    h.post("/v1/chat/completions", content=b"{")
    h.post("/v1/completions", json={"model": "nope", "prompt": "x"})
    m = h.get("/metrics").text
    assert 'muser_requests_total{endpoint="chat",status="400"} 1' in m
    assert 'muser_requests_total{endpoint="completions",status="404"} 1' in m
