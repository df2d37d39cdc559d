"""End to end on the embedded 270M model: the openai client, a multi-turn chat that reuses the cache."""
from __future__ import annotations

import pytest

from server_harness import completions_burst, serve

pytestmark = pytest.mark.slow


def test_gemma_multiturn_reuses_cache_and_streams(gemma):
    with serve(gemma, slots=2, max_context=2048) as srv:
        c = srv.client()
        assert [m.id for m in c.models.list().data] == ["gemma3-270m"]
        msgs = [{"role": "system", "content": "You answer in one short sentence."},
                {"role": "user", "content": "What is the capital of France?"}]
        first = c.chat.completions.create(model="gemma3-270m", messages=msgs, max_tokens=4,
                                          temperature=0)
        reply = first.choices[0].message.content
        assert first.usage.prompt_tokens_details.cached_tokens == 0 and reply
        msgs += [{"role": "assistant", "content": reply},
                 {"role": "user", "content": "And of Italy?"}]
        chunks = list(c.chat.completions.create(model="gemma3-270m", messages=msgs, max_tokens=3,
                                                temperature=0, stream=True,
                                                stream_options={"include_usage": True}))
        usage = chunks[-1].usage
        assert usage.prompt_tokens_details.cached_tokens > 0          # the second turn reused it
        assert usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens
        streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert streamed and usage.completion_tokens <= 3
        again = c.chat.completions.create(model="gemma3-270m", messages=msgs, max_tokens=3,
                                          temperature=0)
        assert again.choices[0].message.content == streamed          # stream == whole, greedy
        text = c.completions.create(model="gemma3-270m", prompt="The capital of France is",
                                    max_tokens=3, temperature=0).choices[0].text
        assert text.strip()


def test_gemma_shift_equals_cold_prefill(gemma):
    from muser.server.policy import plan_chat
    with serve(gemma, slots=1, max_context=96, output_reserve=16) as srv:
        msgs = [{"role": "system", "content": "Be brief."}]
        for i in range(6):
            msgs += [{"role": "user", "content": f"Question {i}: name a colour."},
                     {"role": "assistant", "content": f"Answer {i}: blue."}]
        msgs.append({"role": "user", "content": "And one more colour?"})
        r = srv.client().chat.completions.create(model="gemma3-270m", messages=msgs, max_tokens=1,
                                                 temperature=0)
        ext = r.model_extra["muser"]
        assert ext["shifted"] and ext["context_epoch"] == 1 and ext["dropped_turns"] > 0
        tok = gemma.tokenizer
        plan = plan_chat(msgs, lambda ms: len(tok.apply_chat_template(ms)), srv.state.limits)
        kept = tok.apply_chat_template(plan.messages())
        slot = srv.state.pool.slots[0]
        assert slot.tokens == kept and plan.system == (msgs[0],)
        cold = gemma.new_session()
        cold.prefill(kept)
        assert slot.session.snapshot().equal(cold.snapshot())


def test_default_cpu_answers_do_not_depend_on_what_else_is_served(gemma):
    """Issue 12 at the HTTP surface, on the default CPU configuration: four requests decoded in
    one batch get the same tokens and the same logprobs, bit for bit, as each served alone."""
    if not gemma.exact_rows:
        pytest.skip("not the invariant CPU path (no native kernels)")
    prompts = [f"Question {i}: name {i + 2} things a cache keeps." for i in range(4)]

    def ask(client, p):
        return client.completions.create(model=srv.state.model_id, prompt=p, max_tokens=16,
                                         temperature=0, logprobs=2)

    def key(r):
        c = r.choices[0]
        return c.text, c.logprobs.tokens, c.logprobs.token_logprobs, c.logprobs.top_logprobs

    with serve(gemma, slots=4, output_reserve=16) as srv:
        alone = [key(ask(srv.client(), p)) for p in prompts]
        for s in srv.state.pool.slots:          # no live cache to reuse: the same prefill again
            s.session.reset()
        sizes, real = [], gemma.decode_batch
        gemma.decode_batch = lambda sessions, tokens: (sizes.append(len(sessions)), real(sessions, tokens))[1]
        try:
            batch = [key(r) for r in completions_burst(srv, prompts, max_tokens=16, temperature=0,
                                                       logprobs=2)]
        finally:
            del gemma.decode_batch                # back to the class's method
    assert max(sizes) >= 2                        # they really shared decode steps
    assert batch == alone


def test_drafted_blocks_of_concurrent_requests_verify_in_one_forward_with_their_own_bits(gemma):
    """Prompt-lookup speculation on the default CPU configuration: the drafted choices of a
    round verify in one forward (Engine.shared_chunks), and every answer -- tokens and
    logprobs, bit for bit -- is the plain server's."""
    if not gemma.shared_chunks:
        pytest.skip("not the exact int8 CPU path (no native kernels)")
    passage = ("The ring keeps the last W tokens of every sliding layer, so its memory is flat "
               "however long the conversation grows.")
    prompts = [f"Text {i}: {passage}\nThe same text again, exactly: {passage[:30 + 7 * i]}"
               for i in range(4)]

    def answers(**config):
        with serve(gemma, slots=4, output_reserve=24, **config) as srv:
            calls = []
            spec = srv.state.scheduler.spec
            if spec is not None:
                real = spec.verify_group
                spec.verify_group = lambda engine, items: (calls.append(len(items)), real(engine, items))[1]
            out = [(r.choices[0].text, r.choices[0].logprobs.token_logprobs)
                   for r in completions_burst(srv, prompts, max_tokens=20, temperature=0,
                                              logprobs=1)]
        return out, calls

    plain, _ = answers()
    spec, calls = answers(speculative="prompt-lookup", spec_block=6)
    assert spec == plain
    assert calls and max(calls) >= 2                 # blocks of several requests shared a forward
