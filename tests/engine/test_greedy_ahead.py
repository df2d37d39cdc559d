"""`engine.stream` at temperature 0 on a backend with greedy steps (CUDA's pipeline; here the
CPU's SyncSteps put in its place) runs one step ahead (`generate.greedy_ahead`): the same tokens
as the step-by-step loop, and the session ends holding the same lineage -- after an end of
sequence, after max_tokens, and after a caller that stops reading early."""
import pytest

from muser.backends.greedy import SyncSteps

PROMPTS = ["def add(a, b):\n", "List three colors.", "Hello"]


def run(eng, prompt, max_tokens, take=None, ahead=False, monkeypatch=None):
    if ahead:
        monkeypatch.setattr(eng, "stream_steps", lambda: SyncSteps(eng))
    s = eng.new_session()
    gen = eng.stream(prompt, max_tokens=max_tokens, session=s, chat=prompt != PROMPTS[0])
    out = []
    for t in gen:
        out.append(t)
        if take is not None and len(out) == take:
            gen.close()                       # the caller stops reading
            break
    monkeypatch.undo() if ahead else None
    return out, list(s.tokens)


@pytest.mark.parametrize("max_tokens,take", [(1, None), (2, None), (9, None), (30, None),
                                             (30, 1), (30, 4)])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_one_step_ahead_streams_and_leaves_what_the_plain_loop_does(gemma_default, monkeypatch,
                                                                    prompt, max_tokens, take):
    want = run(gemma_default, prompt, max_tokens, take)
    got = run(gemma_default, prompt, max_tokens, take, ahead=True, monkeypatch=monkeypatch)
    assert got == want


def test_an_end_of_sequence_mid_run_is_taken_back(gemma_default, monkeypatch):
    """A stop id the plain loop meets mid-run (the model's own end of turn rarely comes within a
    test's budget: the line break plays it): the same tokens, the same lineage."""
    import dataclasses
    eng = gemma_default
    newline = eng.tokenizer.encode("\n")[-1]
    spec = eng.spec
    eng.spec = dataclasses.replace(spec, eos_token_ids=(*spec.eos_token_ids, newline))
    try:
        want = run(eng, PROMPTS[0], 24)
        got = run(eng, PROMPTS[0], 24, ahead=True, monkeypatch=monkeypatch)
    finally:
        eng.spec = spec
    assert got == want and len(want[0]) < 24
