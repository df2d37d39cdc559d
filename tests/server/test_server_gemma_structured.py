"""End to end on the embedded 270M model (262,144-token vocabulary): a JSON schema answer, a
required tool call, logprobs consistent with greedy, n=2 -- through the official openai client."""
from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from server_harness import serve

pytestmark = pytest.mark.slow

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
           "required": ["city"], "additionalProperties": False}


@pytest.fixture(scope="module")
def srv(gemma):
    with serve(gemma, slots=2, max_context=1024) as s:
        s.state.engine.grammars.tokenizer
        yield s


def test_gemma_json_schema_and_n(srv):
    c = srv.client()
    msgs = [{"role": "user", "content": "Invent a person. Reply in JSON with name and age."}]
    r = c.chat.completions.create(model="gemma3-270m", messages=msgs, max_tokens=40, temperature=0,
                                  response_format={"type": "json_schema", "json_schema": {
                                      "name": "person", "schema": PERSON, "strict": True}})
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
    r2 = c.chat.completions.create(model="gemma3-270m", messages=msgs, max_tokens=40, n=2, seed=7,
                                   temperature=1.0, response_format={"type": "json_object"})
    assert len(r2.choices) == 2 and r2.usage.prompt_tokens == r.usage.prompt_tokens
    for ch in r2.choices:
        if ch.finish_reason == "stop":
            assert isinstance(json.loads(ch.message.content), dict)


def test_gemma_required_tool_call(srv):
    r = srv.client().chat.completions.create(
        model="gemma3-270m", messages=[{"role": "user", "content": "What is the weather in Oslo?"}],
        tools=[{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}],
        tool_choice="required", parallel_tool_calls=False, max_tokens=40, temperature=0)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.tool_calls[0].function.name == "get_weather"
    jsonschema.validate(json.loads(c.message.tool_calls[0].function.arguments), WEATHER)


def test_gemma_logprobs_match_greedy_and_the_float32_logits(srv, gemma):
    prompt = "The capital of France is"
    r = srv.client().completions.create(model="gemma3-270m", prompt=prompt, max_tokens=4,
                                        temperature=0, logprobs=5)
    lp = r.choices[0].logprobs
    for tok, top in zip(lp.tokens, lp.top_logprobs):
        assert max(top, key=top.get) == tok
    ids = gemma.tokenizer.encode(prompt)
    ref = torch.log_softmax(gemma.new_session().prefill(ids).float(), dim=-1)
    assert lp.token_logprobs[0] == float(ref.max())
