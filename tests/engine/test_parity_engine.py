"""The engine (ring planes, staged chunks, padded chunks) against Hugging Face transformers
on tiny random models of every supported hybrid family (Gemma 3, Cohere2, gpt-oss, Gemma 4
with and without experts, OLMo 3, EXAONE 4, Ministral), for prompts several times longer
than the window."""
import pytest
import torch

from muser.testing import FAMILIES, tiny_model, tiny_model_dir

WINDOW = 4


@pytest.fixture(scope="module", params=["gemma3", "cohere2", *FAMILIES])
def pair(request):
    import transformers
    path = tiny_model_dir(request.param, window=WINDOW, tokenizer=False)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                           attn_implementation="eager").eval()
    return tiny_model(request.param, window=WINDOW, tokenizer=False), hf


def hf_logits(hf, ids):
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float()


@pytest.mark.parametrize("mode", ["chunk-5", "chunk-64", "token-by-token", "extend"])
def test_engine_logits_match_transformers(pair, mode):
    engine, hf = pair
    ids = torch.randint(3, 384, (27,), generator=torch.Generator().manual_seed(3)).tolist()
    ref = hf_logits(hf, ids)
    s = engine.new_session()
    if mode.startswith("chunk"):
        got = s.prefill(ids, chunk_size=int(mode.split("-")[1]))
        torch.testing.assert_close(got, ref[-1], rtol=1e-4, atol=1e-4)
    elif mode == "token-by-token":
        s.prefill(ids[:1])
        for i, t in enumerate(ids[1:], start=1):
            got = s.decode(t)
            torch.testing.assert_close(got, ref[i], rtol=1e-4, atol=1e-4)
    else:
        s.prefill(ids[:9])
        got = s.extend(ids[9:])
        torch.testing.assert_close(got, ref[9:], rtol=1e-4, atol=1e-4)


def test_greedy_continuation_matches_transformers_generate(pair):
    """12 greedy tokens after a prompt longer than the window: the same ids as transformers'
    generate (its own cache: sliding-window layers, Gemma 4's shared KV, gpt-oss's sinks)."""
    engine, hf = pair
    ids = torch.randint(3, 384, (11,), generator=torch.Generator().manual_seed(5)).tolist()
    with torch.no_grad():
        want = hf.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                           pad_token_id=0)[0, len(ids):].tolist()
    got = list(engine.stream(ids, max_tokens=12))                  # stops at an end-of-sequence id
    assert got == want[:len(got)]
    assert len(got) == 12 or want[len(got)] in engine.spec.eos_token_ids
