"""int8 weights for CUDA, host side on the CPU (backends/cuda/weights_int8.py): the per-row
quantization and its error bound, q|k|v and gate|up joined with their scales, what the mode
refuses (and where: `defaults.check` for the configuration, `check_model` for the model),
the weights' byte count, and a tied Q8_0 head's lookup read from its blocks.  The kernel and the engine mode on real kernels:
tests/cuda/test_int8_step.py."""
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from muser.backends.cuda.weights_int8 import (BlockInt8, EmbedBlocks, HeadInt8, RowInt8,
                                              keep_exact_blocks, quantize_blocks,
                                              quantize_rows, quantize_weights, why_not_int8)
from muser.backends.defaults import check, default_head
from muser.config import EngineConfig
from muser.env import Env
from muser.errors import ModelFormatError
from muser.testing import q8_0_values, tiny_model


def test_a_row_is_within_half_a_step_of_its_weights():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(48, 80, generator=g) * torch.rand(48, 1, generator=g)
    w[3] = 0.0                                            # an all-zero row: a tiny scale, q = 0
    r = quantize_rows(w)
    assert r.q.dtype == torch.int8 and r.scale.dtype == torch.float32 and r.shape == (48, 80)
    assert int(r.q.abs().max()) == 127 and torch.all(r.q[3] == 0)
    err = (r.dequantized() - w).abs()
    assert torch.all(err <= r.scale[:, None] / 2 + 1e-7)
    assert r.nbytes() == 48 * 80 + 4 * 48


def test_fused_int8_rows_are_views_of_one_matrix_with_their_scales():
    from muser.backends.cuda.step_weights import fuse_weights
    eng = tiny_model("gemma3", window=4, tokenizer=False)
    quantize_weights(eng.weights)
    lw = eng.weights.layers[0]
    parts = [lw.wq, lw.wk, lw.wv]
    fz = fuse_weights(eng.weights)[0]
    fused = fz["wqkv"]
    assert fused.shape[0] == sum(p.shape[0] for p in parts) and fused.scale.shape == fused.q.shape[:1]
    at = 0
    for p, v in zip(parts, (lw.wq, lw.wk, lw.wv)):                # rebound to views of the stack
        assert torch.equal(p.q, v.q) and torch.equal(p.scale, v.scale)
        assert v.q.data_ptr() == fused.q.data_ptr() + at * fused.q.shape[1]
        assert v.scale.data_ptr() == fused.scale.data_ptr() + 4 * at
        at += p.shape[0]
    assert isinstance(fz["wgu"], RowInt8) and lw.w_up.q.data_ptr() > fz["wgu"].q.data_ptr()


@pytest.mark.parametrize("config, refused", [
    (EngineConfig(device="cuda", dtype="bfloat16", quant="int8"), None),
    (EngineConfig(device="cuda:1", dtype="float16", quant="int8"), None),
    (EngineConfig(device="cpu", dtype="bfloat16", quant="int8"), None),
    (EngineConfig(device="cuda", dtype="float32", quant="int8"), "bfloat16 or float16"),
    (EngineConfig(device="mps", dtype="bfloat16", quant="int8"), "CPU or CUDA"),
    (EngineConfig(device="cuda", dtype="bfloat16", quant="int8-head"), None),
    (EngineConfig(device="cpu", dtype="bfloat16", quant="int8-head"), "CUDA weight mode.*'int8'"),
    (EngineConfig(device="cuda", dtype="float32", quant="int8-head"), "bfloat16 or float16"),
    (EngineConfig(device="cuda", dtype="bfloat16", quant="int8-head-fast"), None),
    (EngineConfig(device="cpu", dtype="bfloat16", quant="int8-head-fast"),
     "'int8-head-fast'.*CUDA weight mode"),
])
def test_int8_runs_on_the_cpu_and_cuda_rings(config, refused):
    if refused is None:
        check(config)
    else:
        with pytest.raises(ModelFormatError, match=refused):
            check(config)


def test_what_the_cuda_int8_mode_needs():
    eng = tiny_model("gemma3", window=4, tokenizer=False)
    assert why_not_int8(eng.spec, eng.weights, Env()) is None
    assert "MUSER_CHUNKS" in why_not_int8(eng.spec, eng.weights, Env(chunks="fast"))
    assert "MUSER_GEMV" in why_not_int8(eng.spec, eng.weights, Env(gemv="fast"))
    moe = tiny_model("gpt_oss", window=4, tokenizer=False)
    assert "experts" in why_not_int8(moe.spec, moe.weights, Env())


@pytest.mark.parametrize("device, dtype, quant, backend, head, env, runs", [
    ("cuda", "bfloat16", "none", "ring", "q8_0", Env(), "int8-head"),
    ("cuda:1", "float16", "none", "ring", "q8_0", Env(), "int8-head"),
    ("cuda", "bfloat16", "none", "ring", "random", Env(), "none"),
    ("cpu", "bfloat16", "none", "ring", "q8_0", Env(), "none"),
    ("cuda", "float32", "none", "ring", "q8_0", Env(), "none"),
    ("cuda", "bfloat16", "none", "oracle", "q8_0", Env(), "none"),
    ("cuda", "bfloat16", "int8-head-fast", "ring", "q8_0", Env(), "int8-head-fast"),
    ("cuda", "bfloat16", "none", "ring", "q8_0", Env(chunks="fast"), "none"),
])
def test_the_cuda_default_keeps_a_q8_0_head_as_its_blocks(device, dtype, quant, backend, head,
                                                            env, runs):
    """defaults.default_head (the loader, when no quant was asked for): a CUDA engine whose head
    is Q8_0 blocks exactly runs quant="int8-head" -- bf16's logits, half the head's bytes --
    with the blocks it found already in place; anything else keeps its configuration and its
    weights untouched.  (The decision reads no device: these weights are on the CPU.)"""
    eng = tiny_model("gemma3", window=4, tokenizer=False, dtype="bfloat16")
    w = eng.weights
    if head == "q8_0":                      # a tied head whose values came from Q8_0 blocks
        w.embed = q8_0_values(w.embed, torch.bfloat16)
    table, before = w.embed, w.nbytes()
    config = EngineConfig(device=device, dtype=dtype, quant=quant, backend=backend)
    out = default_head(config, eng.spec, w, env)
    assert out.quant == runs
    if runs == "int8-head":
        assert out == EngineConfig(device=device, dtype=dtype, quant=runs, backend=backend)
        assert isinstance(w.lm_head, BlockInt8)
        assert torch.equal(w.lm_head.dequantized(torch.bfloat16), table)
        # the lookup reads the same blocks: the float table is gone, not kept beside them
        assert isinstance(w.embed, EmbedBlocks) and w.embed.blocks is w.lm_head
        assert w.nbytes() == before - table.numel() * 2 + w.lm_head.nbytes()
        kept = w.lm_head
        quantize_weights(w, "int8-head")                        # the backend: no second search
        assert w.lm_head is kept
    else:
        assert out is config and w.lm_head is None and w.embed is table


@pytest.mark.parametrize("scaled", [False, True])
def test_a_lookup_from_a_tied_heads_exact_blocks_is_the_float_tables(scaled):
    """EmbedBlocks.rows (transformer.embed, every chunk's first step) == F.embedding of the
    float table it replaced, and Gemma's scale after it -- torch.equal, repeated ids, every
    row of the table once."""
    from muser.model import transformer as tf
    eng = tiny_model("gemma3", window=4, tokenizer=False, dtype="bfloat16")
    w, spec = eng.weights, eng.spec
    table = q8_0_values(w.embed, torch.bfloat16)
    w.embed = table
    assert keep_exact_blocks(w)
    assert isinstance(w.embed, EmbedBlocks) and w.dtype == torch.bfloat16
    spec = spec if scaled else replace(spec, embed_scale=1.0)
    ids = torch.cat([torch.arange(table.shape[0]), torch.tensor([7, 7, 0])])
    want = F.embedding(ids, table)
    if scaled:
        want = want * torch.tensor(spec.embed_scale, dtype=torch.bfloat16)
    assert torch.equal(tf.embed(w, spec, ids), want)


def test_an_explicit_int8_head_on_a_q8_0_head_keeps_the_exact_blocks():
    """quant="int8-head" asked for: a head its blocks give back exactly is kept as those blocks
    (the lookup reading them too, as the default does); any other head gets the nearest Q8_0
    blocks and keeps its float table."""
    eng = tiny_model("gemma3", window=4, tokenizer=False, dtype="bfloat16")
    w = eng.weights
    table = w.embed
    quantize_weights(w, "int8-head")                       # a random head: nearest blocks
    assert w.embed is table and isinstance(w.lm_head, BlockInt8)
    w.lm_head, w.embed = None, q8_0_values(table, torch.bfloat16)
    exact = w.embed
    quantize_weights(w, "int8-head")
    assert isinstance(w.embed, EmbedBlocks) and w.embed.blocks is w.lm_head
    assert torch.equal(w.lm_head.dequantized(torch.bfloat16), exact)


def test_quantized_weights_count_their_bytes_and_keep_the_lookup_table():
    eng = tiny_model("gemma3", window=4, tokenizer=False)
    w = eng.weights
    embed = w.embed
    before = w.nbytes()
    quantize_weights(w)
    lw = w.layers[0]
    assert all(isinstance(getattr(lw, n), RowInt8) for n in ("wq", "wk", "wv", "wo", "w_gate",
                                                               "w_up", "w_down"))
    assert w.embed is embed and isinstance(w.lm_head, RowInt8)      # a tied head: its own copy
    assert w.nbytes() < before


@pytest.mark.parametrize("quant, kind", [("int8-head", BlockInt8), ("int8-head-fast", HeadInt8)])
def test_an_int8_head_leaves_every_layer_float(quant, kind):
    eng = tiny_model("gemma3", window=4, tokenizer=False)
    w = eng.weights
    layers = [[getattr(lw, n) for n in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")]
              for lw in w.layers]
    quantize_weights(w, quant)
    assert all(getattr(lw, n) is t for lw, ts in zip(w.layers, layers)
               for n, t in zip(("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"), ts))
    assert type(w.lm_head) is kind and w.lm_head.shape == w.embed.shape
    quantize = quantize_blocks if kind is BlockInt8 else quantize_rows
    assert torch.equal(w.lm_head.dequantized(), quantize(w.embed).dequantized())


def test_a_weight_mode_that_does_not_exist_is_refused():
    eng = tiny_model("gemma3", window=4, tokenizer=False)
    with pytest.raises(ValueError, match="no CUDA int8 weight mode 'int4'"):
        quantize_weights(eng.weights, "int4")


def test_a_cuda_int8_engine_refuses_a_model_it_cannot_run_before_preparing_it():
    from muser.backends.cuda import CudaBackend
    backend = CudaBackend(EngineConfig(device="cuda", dtype="bfloat16", quant="int8"), Env())
    gemma = tiny_model("gemma3", window=4, tokenizer=False)
    backend.check_model(gemma.spec, gemma.weights)
    moe = tiny_model("gpt_oss", window=4, tokenizer=False)
    with pytest.raises(ModelFormatError, match="int8.*experts"):
        backend.check_model(moe.spec, moe.weights)
    assert not isinstance(moe.weights.layers[0].wq, RowInt8)        # nothing was quantized
    head = CudaBackend(EngineConfig(device="cuda", dtype="bfloat16", quant="int8-head"), Env())
    with pytest.raises(ModelFormatError, match="int8-head.*experts"):
        head.check_model(moe.spec, moe.weights)
    fast = CudaBackend(EngineConfig(device="cuda", dtype="bfloat16", quant="int8-head-fast"),
                       Env())
    with pytest.raises(ModelFormatError, match="int8-head-fast.*experts"):
        fast.check_model(moe.spec, moe.weights)
