"""The GGUF tokenizer gives transformers' ids; chat template; streaming; no-tokenizer dirs."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from muser.errors import ModelFormatError, RequestError, TokenizerUnavailable
from muser.model.tokenizer import StreamDecoder, load_tokenizer, require_tokenizer

TEXTS = [
    "Hello world",
    "  leading spaces and trailing  ",
    "ünïcødé, 世界, Привет, مرحبا",
    "emoji 😀🦩👩‍💻 and 𝕏",
    "def f(x):\n\treturn x ** 2  # square\n\n\nprint(f(3))",
    "<start_of_turn>user\nhi<end_of_turn>",
    "",
]


def test_ids_equal_transformers(gguf_path, gguf_tokenizer, reference_cache):
    """Against transformers' public path, AutoTokenizer.from_pretrained(dir, gguf_file=...)
    (its ids are cached on disk: that path parses the whole GGUF, ~30 s)."""
    def compute():
        import transformers
        hf = transformers.AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        return {t: (hf(t).input_ids, hf(t, add_special_tokens=False).input_ids) for t in TEXTS}
    ref = reference_cache("tokenizer-ids", compute)
    tok = gguf_tokenizer
    for text in TEXTS:
        with_bos, without = ref[text]
        assert tok.encode(text) == with_bos, text
        assert tok.encode(text, add_bos=False) == without, text
        assert tok.decode(without) == text
    assert tok.encode("Hello")[0] == tok.bos_token_id == 2


def test_gemma_facts(gguf_tokenizer):
    tok = gguf_tokenizer
    assert tok.vocab_size == 262_144
    assert set(tok.eos_token_ids) == {1, 106}
    assert tok.token_id("<start_of_turn>") == 105 and tok.token_id("<end_of_turn>") == 106


def test_chat_template(gguf_tokenizer):
    tok = gguf_tokenizer
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there "},
            {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Capital of France?"}]
    text = tok.render_chat(msgs)
    assert text == ("<bos><start_of_turn>user\nBe brief.\n\nHi there<end_of_turn>\n"
                    "<start_of_turn>model\nHello!<end_of_turn>\n"
                    "<start_of_turn>user\nCapital of France?<end_of_turn>\n<start_of_turn>model\n")
    ids = tok.apply_chat_template(msgs)
    assert ids[:3] == [2, 105, tok.encode("user", add_bos=False)[0]] and ids.count(2) == 1
    assert ids == tok.encode(text, add_bos=False)
    assert not tok.render_chat(msgs[1:2], add_generation_prompt=False).endswith("<start_of_turn>model\n")
    with pytest.raises(RequestError):
        tok.apply_chat_template([{"role": "assistant", "content": "out of order"}])


def test_stream_decoder_never_splits_a_character(gguf_tokenizer):
    tok = gguf_tokenizer
    text = "Flamingo 🦩 and 𝕏 are byte-fallback; 世界 is not. ünï"
    ids = tok.encode(text, add_bos=False)
    pieces = [tok.decode([i]) for i in ids]
    assert any("\ufffd" in p for p in pieces), "expected byte-fallback tokens in this text"
    dec = StreamDecoder(tok)
    deltas = [dec.push(i) for i in ids] + [dec.flush()]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == tok.decode(ids) == text


def test_stream_decoder_flushes_an_incomplete_tail(gguf_tokenizer):
    tok = gguf_tokenizer
    ids = tok.encode("🦩", add_bos=False)
    assert len(ids) > 1
    dec = StreamDecoder(tok)
    assert [dec.push(i) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert "\ufffd" in dec.flush()


def test_load_is_cached(gguf_path, gguf_tokenizer):
    assert load_tokenizer(gguf_path) is gguf_tokenizer


def test_dir_without_tokenizer(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    tok = load_tokenizer(tmp_path)
    assert tok is None
    with pytest.raises(TokenizerUnavailable):
        require_tokenizer(tok)


def test_hf_dir_tokenizer_roundtrip(tmp_path, gguf_tokenizer):
    """A HF directory written by transformers loads offline, keeps its chat template,
    and gives the same ids."""
    gguf_tokenizer.hf.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma3_text"}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 106]}))
    tok = load_tokenizer(tmp_path)
    for text in TEXTS[:5]:
        assert tok.encode(text) == gguf_tokenizer.encode(text)
    assert set(tok.eos_token_ids) == {1, 106}
    assert tok.render_chat([{"role": "user", "content": "x"}]) == \
        "<bos><start_of_turn>user\nx<end_of_turn>\n<start_of_turn>model\n"


def test_no_template_is_an_error(tmp_path, gguf_tokenizer):
    gguf_tokenizer.hf.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    tok = load_tokenizer(tmp_path)
    with pytest.raises(ModelFormatError):
        tok.apply_chat_template([{"role": "user", "content": "x"}])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids=st.lists(st.one_of(st.integers(0, 300), st.integers(0, 262_143)), max_size=8),
       skip=st.booleans())
def test_decode_through_the_rust_tokenizer_equals_transformers_decode(gguf_tokenizer, ids, skip):
    """`Tokenizer.decode` skips transformers' Python layers (the server's worker calls it twice
    a streamed token): the same text as transformers' own decode with clean-up off, special
    tokens kept or skipped, on ids anywhere in the vocabulary (the first 300: Gemma's specials)."""
    tok = gguf_tokenizer
    assert tok._rust is not None
    ids = [i % tok.vocab_size for i in ids]
    want = tok.hf.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False)
    assert tok.decode(ids, skip) == want
