"""A harmony chat (gpt-oss) through the real server and the official client: the analysis channel
comes back as `reasoning_content`, the final channel as `content`, streamed and not.

The tiny gpt-oss model has random weights, so the model's token choices are scripted (the
tokens a trained gpt-oss writes); everything else -- prefill, decode steps, the channel split,
stop strings, JSON, SSE -- is the real path."""
import pytest

from muser.engine.picker import Pick
from muser.server import choices
from muser.server.channels import ChannelText
from muser.testing import tiny_model
from server_harness import serve

REPLY = ("<|channel|>analysis<|message|>The user wants a sum. 2 + 2 = 4.<|end|>"
         "<|start|>assistant<|channel|>final<|message|>The answer is 4.<|return|>")


@pytest.fixture(scope="module")
def oss():
    return tiny_model("gpt_oss", max_context=1024)


class Scripted:
    """A picker that writes `ids` whatever the logits say."""
    logprobs, constraint, stopped = None, None, False

    def __init__(self, ids):
        self.ids = list(ids)

    def pick(self, logits):
        return Pick(self.ids.pop(0))


def script(oss, monkeypatch, reply=REPLY):
    ids = oss.tokenizer.encode(reply, add_bos=False)
    monkeypatch.setattr(choices.Decoding, "picker", lambda self, engine, i, prompt, c=None: Scripted(ids))
    return ids


@pytest.fixture()
def scripted(oss, monkeypatch):
    return script(oss, monkeypatch)


def split(tok, ids, stops=()):
    ct, content, thought = ChannelText(tok, list(stops)), "", ""
    for t in ids:
        out, stopped = ct.push(t)
        content, thought = content + out, thought + ct.take_reasoning()
        if stopped:
            return thought, content, True
    return thought + ct.take_reasoning(), content + ct.flush(), False


def test_the_channels_split_token_by_token(oss):
    tok = oss.tokenizer
    ids = tok.encode(REPLY, add_bos=False)
    assert split(tok, ids) == ("The user wants a sum. 2 + 2 = 4.", "The answer is 4.", False)
    # a stop string cuts the answer, never the reasoning (which contains it too)
    assert split(tok, ids, ["= 4"]) == ("The user wants a sum. 2 + 2 = 4.", "The answer is 4.", False)
    assert split(tok, ids, ["is 4"]) == ("The user wants a sum. 2 + 2 = 4.", "The answer ", True)
    # a header naming a recipient and a constraint still names its channel
    assert ChannelText._channel("assistant<|channel|>commentary to=functions.f <|constrain|>json") \
        == "commentary"


@pytest.mark.parametrize("stream", [False, True])
def test_a_harmony_reply_comes_back_as_reasoning_and_content(oss, scripted, stream):
    with serve(oss, model_id="oss", slots=1, output_reserve=64) as srv:
        client = srv.client()
        msgs = [{"role": "user", "content": "What is 2 + 2?"}]
        if not stream:
            r = client.chat.completions.create(model="oss", messages=msgs, max_tokens=64)
            m = r.choices[0].message
            assert m.content == "The answer is 4."
            assert m.model_extra["reasoning_content"] == "The user wants a sum. 2 + 2 = 4."
            assert r.choices[0].finish_reason == "stop"
            assert r.usage.completion_tokens == len(scripted)
            return
        thought, content = "", ""
        for ch in client.chat.completions.create(model="oss", messages=msgs, max_tokens=64, stream=True):
            if ch.choices:
                d = ch.choices[0].delta
                thought += (d.model_extra or {}).get("reasoning_content") or ""
                content += d.content or ""
        assert (thought, content) == ("The user wants a sum. 2 + 2 = 4.", "The answer is 4.")


def test_a_gemma_chat_has_no_reasoning_field(tiny):
    with serve(tiny, model_id="tiny", slots=1, output_reserve=32) as srv:
        r = srv.client().chat.completions.create(model="tiny", max_tokens=4, temperature=0,
                                                 messages=[{"role": "user", "content": "hi"}])
        assert "reasoning_content" not in (r.choices[0].message.model_extra or {})


def test_reasoning_effort_reaches_the_template_and_bad_values_are_refused(oss, scripted):
    with serve(oss, model_id="oss", slots=1, output_reserve=64) as srv:
        msgs = [{"role": "user", "content": "What is 2 + 2?"}]
        r = srv.client().chat.completions.create(model="oss", messages=msgs, max_tokens=64,
                                                 reasoning_effort="high")
        low = oss.tokenizer.apply_chat_template(msgs, True)
        high = oss.tokenizer.apply_chat_template(msgs, True, {"reasoning_effort": "high"})
        assert low != high and "Reasoning: high" in oss.tokenizer.decode(high)
        assert r.usage.prompt_tokens == len(high)
        bad = srv.http().post("/v1/chat/completions", json={"model": "oss", "messages": msgs,
                                                            "reasoning_effort": "extreme"})
        assert bad.status_code == 400 and "reasoning_effort" in bad.text


CALL = ("<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>')
WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@pytest.mark.parametrize("stream", [False, True])
def test_a_harmony_function_call_comes_back_as_tool_calls(oss, monkeypatch, stream):
    script(oss, monkeypatch, CALL)
    with serve(oss, model_id="oss", slots=1, output_reserve=64) as srv:
        client = srv.client()
        msgs = [{"role": "user", "content": "Weather in Paris?"}]
        if not stream:
            r = client.chat.completions.create(model="oss", messages=msgs, max_tokens=200, tools=WEATHER)
            c = r.choices[0]
            assert c.finish_reason == "tool_calls" and not c.message.content
            assert [(t.function.name, t.function.arguments) for t in c.message.tool_calls] == \
                [("get_weather", '{"city": "Paris"}')]
            assert c.message.model_extra["reasoning_content"] == "Need the weather."
            return
        name, args, finish = "", "", None
        for ch in client.chat.completions.create(model="oss", messages=msgs, max_tokens=200,
                                                 tools=WEATHER, stream=True):
            if ch.choices:
                d = ch.choices[0].delta
                for t in d.tool_calls or []:
                    name += t.function.name or ""
                    args += t.function.arguments or ""
                finish = ch.choices[0].finish_reason or finish
        assert (name, args, finish) == ("get_weather", '{"city": "Paris"}', "tool_calls")


def test_a_reply_that_never_opens_a_message_is_read_as_content(oss):
    """A model that ignores its template (or random weights) must not go silent."""
    from muser.server.channels import MAX_HEADER
    tok = oss.tokenizer
    ids = tok.encode("just some plain words " * 30, add_bos=False)
    assert len(ids) > MAX_HEADER
    assert split(tok, ids) == ("", tok.decode(ids), False)


def test_muser_chat_prints_the_answer_and_sends_the_reasoning_to_stderr(oss, monkeypatch, capsys):
    import argparse
    import importlib
    cli = importlib.import_module("muser.cli.main")
    ids = oss.tokenizer.encode(REPLY, add_bos=False)
    monkeypatch.setattr(cli, "load_engine", lambda args: oss)
    monkeypatch.setattr(type(oss), "stream", lambda self, *a, **k: iter(ids))
    lines = iter(["What is 2 + 2?"])

    def fake_input(prompt=""):
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None
    monkeypatch.setattr("builtins.input", fake_input)
    args = argparse.Namespace(system=None, max_tokens=64, temperature=0.0, top_p=1.0, top_k=0,
                              seed=None, stop=None, stats=False)
    assert cli.cmd_chat(args) == 0
    out, err = capsys.readouterr()
    assert "model> The answer is 4." in out and "sum" not in out
    assert "The user wants a sum. 2 + 2 = 4." in err
