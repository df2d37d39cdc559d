"""Function calling through the official openai client: tool_choice required / named / auto /
none, parallel calls, streamed tool-call deltas, tool results on the next turn."""
from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from server_harness import serve

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                            "unit": {"enum": ["c", "f"]}},
           "required": ["city", "unit"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9},
                                        "b": {"type": "integer", "minimum": 0, "maximum": 9}},
       "required": ["a", "b"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather now",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "parameters": ADD}}]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
USER = [{"role": "user", "content": "weather in paris?"}]


@pytest.fixture(scope="module")
def srv():
    from muser.testing import tiny_model
    with serve(tiny_model(max_context=1024), model_id="tiny", slots=2, output_reserve=64) as s:
        s.state.engine.grammars.tokenizer
        yield s


def call(srv, **kw):
    kw.setdefault("messages", USER)
    kw.setdefault("max_tokens", 120)
    kw.setdefault("tools", TOOLS)
    return srv.client().chat.completions.create(model="tiny", **kw)


def assert_valid_calls(calls, names=SCHEMAS):
    assert calls
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_") and c.function.name in names
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])


@pytest.mark.parametrize("temperature,seeds", [(0.0, [0]), (1.0, [1, 2])])
def test_required_always_yields_valid_calls(srv, temperature, seeds):
    for seed in seeds:
        r = call(srv, tool_choice="required", temperature=temperature, seed=seed, max_tokens=90)
        c = r.choices[0]
        assert c.finish_reason in ("tool_calls", "length")
        assert_valid_calls(c.message.tool_calls)


def test_named_choice_and_no_parallel_calls_give_exactly_that_one_call(srv):
    r = call(srv, tool_choice={"type": "function", "function": {"name": "add"}},
             parallel_tool_calls=False, temperature=1.0, seed=5)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    assert [t.function.name for t in c.message.tool_calls] == ["add"]
    assert_valid_calls(c.message.tool_calls, {"add"})


def test_streamed_tool_call_deltas_rebuild_the_same_calls(srv):
    kw = dict(tool_choice="required", temperature=0, parallel_tool_calls=False)
    whole = call(srv, **kw).choices[0].message.tool_calls
    calls, finish = {}, None
    for ch in srv.client().chat.completions.create(model="tiny", messages=USER, tools=TOOLS,
                                                   max_tokens=120, stream=True, **kw):
        for c in ch.choices:
            for d in c.delta.tool_calls or []:
                slot = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
                if d.id:
                    assert slot["id"] is None
                    slot["id"], slot["name"] = d.id, d.function.name
                slot["arguments"] += d.function.arguments or ""
            finish = c.finish_reason or finish
    assert finish == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == \
        [(t.function.name, json.loads(t.function.arguments)) for t in whole]


def test_tool_results_are_accepted_on_the_next_turn(srv):
    first = call(srv, tool_choice="required", temperature=0, parallel_tool_calls=False)
    tc = first.choices[0].message.tool_calls[0]
    msgs = USER + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": tc.id, "type": "function", "function": {"name": tc.function.name,
                                                           "arguments": tc.function.arguments}}]},
        {"role": "tool", "tool_call_id": tc.id, "content": '{"temp": 21}'},
        {"role": "user", "content": "thanks, and in rome?"}]
    r = call(srv, messages=msgs, tool_choice="auto", temperature=0, max_tokens=8)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # the rendered prompt carries the call and the result
    rendered = srv.state.tokenizer.decode(srv.state.pool.slots[r.model_extra["muser"]["slot"]].tokens)
    assert "<tool_response>" in rendered and tc.function.name in rendered


def test_auto_and_none_answer_in_text_unless_the_text_is_a_valid_call(srv):
    for choice in ("auto", "none"):
        r = call(srv, tool_choice=choice, temperature=0, max_tokens=10)
        m = r.choices[0].message
        assert m.tool_calls is None and isinstance(m.content, str)


def test_n_and_tools_and_bad_tools(srv):
    r = call(srv, tool_choice="required", n=2, temperature=1.0, seed=1, parallel_tool_calls=False)
    for c in r.choices:
        assert c.finish_reason == "tool_calls", c
        assert_valid_calls(c.message.tool_calls)
    bad = [
        (dict(tools=[TOOLS[0], TOOLS[0]]), "tools[1].function.name"),
        (dict(tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice.function.name"),
        (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "zzz"}}}],
              tool_choice="required"), "tools[0].function.parameters"),
        (dict(tool_choice="required", response_format={"type": "json_object"}), "tool_choice"),
    ]
    for kw, param in bad:
        with pytest.raises(openai.BadRequestError) as e:
            call(srv, **kw)
        assert e.value.body["param"] == param, e.value.body
