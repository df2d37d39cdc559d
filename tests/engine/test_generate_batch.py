"""`Engine.generate_batch`: several prompts decoded together, each answer what `generate` returns
for that prompt alone -- greedy (through `decode_greedy`) and sampled with per-prompt seeds, stop
strings included -- on the embedded 270M's CPU default (bf16 + int8) and its float32 path."""
import pytest

from muser.errors import RequestError

PROMPTS = ["Say hello in one word.", "List three colors.", "Write a haiku about rain.",
           "def fib(n):\n"]


@pytest.mark.parametrize("which", ["gemma_default", "embedded"])
def test_a_greedy_batch_answers_each_prompt_as_generate_does(request, which):
    eng = request.getfixturevalue(which)
    want = [eng.generate(p, max_tokens=18, chat=True) for p in PROMPTS]
    assert eng.generate_batch(PROMPTS, max_tokens=18, chat=True) == want
    cut = [eng.generate(p, max_tokens=18, stop=["\n", "."]) for p in PROMPTS]
    assert eng.generate_batch(PROMPTS, max_tokens=18, stop=["\n", "."]) == cut


def test_a_sampled_batch_answers_each_prompt_with_its_own_seed(gemma_default):
    eng = gemma_default
    want = [eng.generate(p, max_tokens=12, temperature=0.9, top_k=40, seed=7 + i)
            for i, p in enumerate(PROMPTS)]
    got = eng.generate_batch(PROMPTS, max_tokens=12, temperature=0.9, top_k=40, seed=7)
    assert got == want and len(set(got)) > 1


def test_generate_batch_refuses_what_generate_refuses(gemma_default):
    with pytest.raises(RequestError):
        gemma_default.generate_batch(PROMPTS, max_tokens=-1)
    with pytest.raises(RequestError):
        gemma_default.generate_batch(["hi", []], max_tokens=3)
    assert gemma_default.generate_batch(PROMPTS[:2], max_tokens=0) == ["", ""]
