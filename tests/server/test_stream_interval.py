"""--stream-interval N: a stream's first token goes out at once, then a chunk every N tokens
with everything since -- the same text, logprobs and finish as N = 1 and as the whole
response (a real server over HTTP, the tiny model, the openai client)."""
from __future__ import annotations

import pytest

from muser.server.config import ServerConfig
from server_harness import serve

CHAT = [{"role": "user", "content": "Say something about rivers."}]


@pytest.fixture(scope="module")
def every4(tiny):
    with serve(tiny, model_id="tiny", slots=2, output_reserve=32, stream_interval=4) as srv:
        yield srv


def _token_counts(chunks) -> list[int]:
    return [len(ch.choices[0].logprobs.tokens) for ch in chunks
            if ch.choices and ch.choices[0].logprobs and ch.choices[0].logprobs.tokens]


def test_a_completion_stream_sends_the_first_token_then_every_fourth(every4):
    c = every4.client()
    kw = dict(model="tiny", prompt="the quick brown", max_tokens=13, temperature=0, logprobs=1)
    whole = c.completions.create(**kw)
    chunks = list(c.completions.create(**kw, stream=True))
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == whole.choices[0].text
    counts = _token_counts(chunks)
    n = whole.usage.completion_tokens
    assert sum(counts) == n == len(whole.choices[0].logprobs.tokens)
    assert counts[0] == 1 and all(k == 4 for k in counts[1:-1]) and 1 <= counts[-1] <= 4
    assert len(counts) == 1 + -(-(n - 1) // 4)
    finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finals == [whole.choices[0].finish_reason]


def test_a_chat_stream_at_interval_4_is_the_whole_answer(every4):
    c = every4.client()
    whole = c.chat.completions.create(model="tiny", messages=CHAT, max_tokens=11, temperature=0)
    chunks = list(c.chat.completions.create(model="tiny", messages=CHAT, max_tokens=11,
                                            temperature=0, stream=True))
    pieces = [ch.choices[0].delta.content for ch in chunks if ch.choices and ch.choices[0].delta.content]
    assert "".join(pieces) == whole.choices[0].message.content
    assert len(pieces) <= 1 + -(-(whole.usage.completion_tokens - 1) // 4)
    assert len({ch.created for ch in chunks}) == 1 and len({ch.id for ch in chunks}) == 1


def test_held_text_never_passes_a_stop_string(every4):
    c = every4.client()
    full = c.completions.create(model="tiny", prompt="hello", max_tokens=12, temperature=0).choices[0].text
    stop = full[5:7]
    if not stop.strip("\ufffd") or full.find(stop) < 1:
        pytest.skip("generated text has no usable stop string")
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model="tiny", prompt="hello", max_tokens=12, temperature=0, stop=[stop], stream=True)
        if ch.choices)
    assert streamed == full[:full.find(stop)]


def test_the_default_interval_sends_every_token(tiny_server):
    chunks = list(tiny_server.client().completions.create(
        model="tiny", prompt="the quick brown", max_tokens=7, temperature=0, logprobs=1, stream=True))
    assert set(_token_counts(chunks)) == {1}


@pytest.mark.parametrize("bad", [0, -1, 4097])
def test_an_interval_outside_1_to_4096_is_refused(bad):
    with pytest.raises(ValueError, match="stream_interval"):
        ServerConfig(stream_interval=bad)
