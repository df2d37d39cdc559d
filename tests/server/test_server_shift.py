"""Context shifts over HTTP: what is kept, that the rebuilt cache is exact, and refusals."""
from __future__ import annotations

import openai
import pytest

from server_harness import serve
from muser.server.policy import plan_chat

SYSTEM = {"role": "system", "content": "you are a helpful model. be brief."}


def conversation(n):
    ms = [SYSTEM]
    for i in range(n):
        ms += [{"role": "user", "content": f"turn {i}: how are you? the quick brown fox"},
               {"role": "assistant", "content": f"fine, thanks {i}. hello world!"}]
    return ms + [{"role": "user", "content": "and now: def add(a, b): return a + b"}]


@pytest.fixture()
def shift_server(tiny):
    with serve(tiny, model_id="tiny", slots=2, max_context=160, output_reserve=24) as srv:
        yield srv


def expected_plan(state, messages):
    tok = state.engine.tokenizer
    return plan_chat(messages, lambda ms: len(tok.apply_chat_template(ms)), state.limits)


def test_shift_keeps_system_and_newest_turns_and_equals_cold_prefill(shift_server):
    srv, state = shift_server, shift_server.state
    msgs = conversation(8)
    tok = state.engine.tokenizer
    assert len(tok.apply_chat_template(msgs)) > 160             # grown past --max-context
    plan = expected_plan(state, msgs)
    assert plan.shifted and plan.system == (SYSTEM,)
    r = srv.client().chat.completions.create(model="tiny", messages=msgs, max_tokens=1,
                                             temperature=0)
    ext = r.model_extra["muser"]
    assert ext["shifted"] is True and ext["context_epoch"] == 1
    assert ext["dropped_turns"] == plan.dropped_turns > 0
    assert "dropped" in ext["plan"]
    retained = tok.apply_chat_template(plan.messages())
    assert r.usage.prompt_tokens == len(retained) <= 160 - 24
    slot = state.pool.slots[ext["slot"]]
    assert slot.tokens == retained                             # system + newest whole turns
    cold = state.engine.new_session()
    cold.prefill(retained)
    assert slot.session.snapshot().equal(cold.snapshot())      # bitwise
    assert state.pool.staging.position == 0                    # old generation emptied
    assert "muser_context_shifts_total 1" in srv.http().get("/metrics").text

    # a continuation of the shifted conversation extends the slot's cache: no new shift
    nxt = msgs + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
    p2 = plan_chat(nxt, lambda ms: len(tok.apply_chat_template(ms)), state.limits,
                   start=plan.dropped_turns)
    assert p2.first_kept == plan.first_kept       # the fixture is sized so it still fits
    r2 = srv.client().chat.completions.create(model="tiny", messages=nxt, max_tokens=1,
                                              temperature=0)
    e2 = r2.model_extra["muser"]
    assert e2["slot"] == ext["slot"] and e2["shifted"] is False and e2["context_epoch"] == 1
    assert r2.usage.prompt_tokens_details.cached_tokens == len(retained)
    # growing further extends the cache while the low-water mark's slack lasts, then
    # re-shifts in the same slot (its lineage) and advances the epoch
    longer, extended = nxt, 0
    for _ in range(10):
        longer = longer + [{"role": "assistant", "content": "the quick brown fox jumps"},
                           {"role": "user", "content": "over the lazy dog, again and again"}]
        r3 = srv.client().chat.completions.create(model="tiny", messages=longer, max_tokens=1,
                                                  temperature=0)
        e3 = r3.model_extra["muser"]
        assert e3["slot"] == ext["slot"]
        if e3["shifted"]:
            break
        extended += 1
        assert r3.usage.prompt_tokens_details.cached_tokens > 0 and e3["context_epoch"] == 1
    assert e3["shifted"] is True and e3["context_epoch"] == 2
    assert e3["dropped_turns"] > ext["dropped_turns"]
    assert r3.usage.prompt_tokens <= state.limits.low_water            # dropped to the mark


def test_changed_system_is_a_new_conversation(shift_server):
    srv = shift_server
    msgs = conversation(8)
    r = srv.client().chat.completions.create(model="tiny", messages=msgs, max_tokens=1, temperature=0)
    other = [{"role": "system", "content": "you are terse."}] + msgs[1:] + [
        {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
    r2 = srv.client().chat.completions.create(model="tiny", messages=other, max_tokens=1, temperature=0)
    assert r2.usage.prompt_tokens_details.cached_tokens == 0
    assert r2.model_extra["muser"]["slot"] != r.model_extra["muser"]["slot"]     # LRU, not lineage


def test_error_policy_refuses_with_numbers(tiny):
    with serve(tiny, model_id="tiny", slots=1, max_context=160, output_reserve=24,
               context_policy="error") as srv:
        msgs = conversation(8)
        n = len(tiny.tokenizer.apply_chat_template(msgs))
        with pytest.raises(openai.BadRequestError) as e:
            srv.client().chat.completions.create(model="tiny", messages=msgs, max_tokens=1)
        body = e.value.body
        assert body["code"] == "context_length_exceeded"
        assert str(n) in body["message"] and "160" in body["message"] and "24" in body["message"]
        # a conversation that fits is served
        ok = srv.client().chat.completions.create(model="tiny", messages=conversation(0), max_tokens=1)
        assert ok.usage.completion_tokens == 1


def test_unfittable_newest_turn_is_refused(shift_server):
    msgs = [SYSTEM, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
            {"role": "user", "content": "the quick brown fox jumps over the lazy dog. " * 10}]
    with pytest.raises(openai.BadRequestError) as e:
        shift_server.client().chat.completions.create(model="tiny", messages=msgs, max_tokens=1)
    body = e.value.body
    assert body["code"] == "context_length_exceeded"
    assert "newest complete turn" in body["message"] and "160" in body["message"]
    assert shift_server.http().get("/health").json()["status"] == "healthy"


def test_late_system_message_is_refused(shift_server):
    msgs = [{"role": "user", "content": "hi"}, {"role": "system", "content": "late"}]
    with pytest.raises(openai.BadRequestError) as e:
        shift_server.client().chat.completions.create(model="tiny", messages=msgs, max_tokens=1)
    assert "system messages must all come before" in e.value.body["message"]


def test_raw_shift_keeps_prefix_and_newest_suffix(tiny):
    with serve(tiny, model_id="tiny", slots=1, max_context=64, output_reserve=8, keep=3) as srv:
        state = srv.state
        low = state.limits.low_water                           # 0.7 x 56 -> 39 tokens kept
        assert low == int(0.7 * 56)
        prompt = [2] + [10 + (i % 200) for i in range(100)]
        r = srv.client().completions.create(model="tiny", prompt=prompt, max_tokens=1, temperature=0)
        ext = r.model_extra["muser"]
        assert ext["shifted"] and ext["context_epoch"] == 1 and ext["dropped_tokens"] == 101 - low
        kept = prompt[:4] + prompt[-(low - 4):]
        slot = state.pool.slots[0]
        assert slot.tokens == kept and r.usage.prompt_tokens == low
        cold = state.engine.new_session()
        cold.prefill(kept)
        assert slot.session.snapshot().equal(cold.snapshot())
        # the prefix-pinned continuation still fits the budget: it extends the shifted cache
        r2 = srv.client().completions.create(model="tiny", prompt=prompt + [7], max_tokens=1)
        assert r2.model_extra["muser"]["context_epoch"] == 1
        assert r2.usage.prompt_tokens_details.cached_tokens == low
        # error policy on the raw path
    with serve(tiny, model_id="tiny", slots=1, max_context=64, output_reserve=8,
               context_policy="error") as srv:
        with pytest.raises(openai.BadRequestError) as e:
            srv.client().completions.create(model="tiny", prompt=[2] * 60, max_tokens=1)
        assert e.value.body["code"] == "context_length_exceeded" and "60" in e.value.body["message"]
