"""POST /tokenize and /detokenize: the server's tokenizer over HTTP -- a count that is the one
the generation endpoints bill (usage.prompt_tokens), ids that decode back, bad input refused."""
from __future__ import annotations

import pytest

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a river."}]


def _post(srv, path, body, **kw):
    return srv.http().post(path, json=body, **kw)


def test_a_prompt_counts_as_the_completions_endpoint_bills_it(tiny_server):
    r = _post(tiny_server, "/tokenize", {"model": "tiny", "prompt": "the quick brown fox"})
    assert r.status_code == 200
    body = r.json()
    billed = tiny_server.client().completions.create(model="tiny", prompt="the quick brown fox",
                                                     max_tokens=1, temperature=0)
    assert body["count"] == len(body["tokens"]) == billed.usage.prompt_tokens
    assert body["max_model_len"] == tiny_server.state.max_context
    plain = _post(tiny_server, "/tokenize", {"prompt": "the quick brown fox",
                                              "add_special_tokens": False}).json()
    assert body["tokens"][-plain["count"]:] == plain["tokens"]


def test_messages_count_as_the_chat_endpoint_bills_them(tiny_server):
    body = _post(tiny_server, "/tokenize", {"model": "tiny", "messages": CHAT}).json()
    billed = tiny_server.client().chat.completions.create(model="tiny", messages=CHAT,
                                                          max_tokens=1, temperature=0)
    assert body["count"] == billed.usage.prompt_tokens
    bare = _post(tiny_server, "/tokenize", {"messages": CHAT, "add_generation_prompt": False}).json()
    assert bare["count"] < body["count"] and body["tokens"][:bare["count"]] == bare["tokens"]


def test_ids_decode_back_to_the_prompt_and_token_strs_are_their_pieces(tiny_server):
    text = "rivers run, 12 times"
    body = _post(tiny_server, "/tokenize", {"prompt": text, "add_special_tokens": False,
                                            "return_token_strs": True}).json()
    assert "".join(body["token_strs"]) == text
    back = _post(tiny_server, "/detokenize", {"model": "tiny", "tokens": body["tokens"]}).json()
    assert back == {"prompt": text}


@pytest.mark.parametrize("path, body, status, names", [
    ("/tokenize", {"prompt": "a", "messages": CHAT}, 400, "exactly one"),
    ("/tokenize", {}, 400, "exactly one"),
    ("/tokenize", {"prompt": 5}, 400, "prompt"),
    ("/tokenize", {"model": "other", "prompt": "a"}, 404, "other"),
    ("/detokenize", {"tokens": [1, 10 ** 9]}, 400, "tokens"),
    ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
    ("/detokenize", {"tokens": "12"}, 400, "tokens"),
])
def test_bad_tokenize_requests_are_refused_by_name(tiny_server, path, body, status, names):
    r = _post(tiny_server, path, body)
    assert r.status_code == status and names in r.text


def test_the_tokenizer_endpoints_take_the_api_key(tiny):
    from server_harness import serve
    with serve(tiny, model_id="tiny", slots=1, api_key="sesame") as srv:
        for path, body in (("/tokenize", {"prompt": "a"}), ("/detokenize", {"tokens": [3]})):
            assert _post(srv, path, body).status_code == 401
            ok = _post(srv, path, body, headers={"Authorization": "Bearer sesame"})
            assert ok.status_code == 200
