"""The embedded GGUF: dequantization, the layer map read from its header, and
numerical agreement of muser's forward with transformers' loading of the same file."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize as np_dequantize, quantize as np_quantize

from muser.model.dequant import dequantize
from muser.model.gguf_loader import raw_q8_0
from muser.model.spec_gguf import spec_from_gguf
from muser.model import transformer as tf


def test_every_tensor_type_matches_gguf_py(gguf_path):
    """Bitwise equality with gguf.quants.dequantize, a few tensors per type."""
    from muser.model.gguf_file import GGUFFile
    r = GGUFFile(gguf_path)
    per_type: dict[Q, list] = {}
    for t in r.tensors:
        per_type.setdefault(t.tensor_type, []).append(t)
    assert {Q.F32, Q.Q8_0, Q.Q5_0, Q.Q4_K, Q.Q6_K} <= set(per_type)
    for ttype, ts in per_type.items():
        for t in ts[:3]:
            if t.name == "token_embd.weight":
                continue                        # 262k rows: checked on a row slice below
            want = torch.from_numpy(np.array(np_dequantize(t.data, ttype))).reshape(t.torch_shape)
            got = dequantize(t.data, ttype)
            assert torch.equal(got, want), (t.name, ttype.name)
    emb = r.tensor("token_embd.weight")
    rows = emb.data[100_000:100_512]
    assert torch.equal(dequantize(rows, emb.tensor_type), torch.from_numpy(np_dequantize(rows, emb.tensor_type)))


@pytest.mark.parametrize("ttype", [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.BF16, Q.F16])
def test_other_block_types_match_gguf_py(ttype):
    """Types the embedded file lacks: quantize random data with gguf-py, dequantize both ways."""
    x = np.random.default_rng(0).standard_normal((8, 256)).astype(np.float32) * 3
    raw = np_quantize(x, ttype)
    want = torch.from_numpy(np.array(np_dequantize(raw, ttype), dtype=np.float32))
    assert torch.equal(dequantize(raw, ttype), want)


def test_k_quants_match_gguf_py_on_random_bytes():
    """Q4_K/Q5_K/Q6_K (gguf-py cannot quantize them): random block bytes with sane f16 scales."""
    rng = np.random.default_rng(1)
    for ttype, (size, d_at) in {Q.Q4_K: (144, (0, 2)), Q.Q5_K: (176, (0, 2)), Q.Q6_K: (210, (208,))}.items():
        raw = rng.integers(0, 256, size=(6, size), dtype=np.uint8)
        for at in d_at:
            raw[:, at:at + 2] = np.full((6, 1), 0.01, np.float16).view(np.uint8)
        want = torch.from_numpy(np.array(np_dequantize(raw, ttype)))
        assert torch.equal(dequantize(raw, ttype), want), ttype.name


def test_raw_q8_0_reconstructs(gguf_path):
    from muser.model.gguf_file import GGUFFile
    r = GGUFFile(gguf_path)
    name = next(t.name for t in r.tensors if t.tensor_type == Q.Q8_0 and t.name != "token_embd.weight")
    qs, scales = raw_q8_0(r, name)
    t = r.tensor(name)
    rows, cols = t.torch_shape
    assert qs.dtype == torch.int8 and qs.shape == (rows, cols)
    assert scales.dtype == torch.float32 and scales.shape == (rows, cols // 32)
    recon = (qs.float().view(rows, -1, 32) * scales[..., None]).reshape(rows, cols)
    assert torch.equal(recon, dequantize(t.data, t.tensor_type))
    with pytest.raises(Exception):
        raw_q8_0(r, "blk.0.attn_q.weight")          # Q5_0, not Q8_0


def test_spec_from_embedded_gguf(gguf_path):
    spec = spec_from_gguf(gguf_path)
    assert spec.architecture == "gemma3" and spec.num_layers == 18
    assert [l.index for l in spec.layers if l.kind == "full"] == [5, 11, 17]
    assert all(l.window == 512 for l in spec.layers if l.kind == "sliding")
    assert all(l.rope for l in spec.layers)
    assert {l.rope_theta for l in spec.layers if l.kind == "sliding"} == {10_000.0}
    assert {l.rope_theta for l in spec.layers if l.kind == "full"} == {1_000_000.0}
    assert (spec.hidden_size, spec.intermediate_size, spec.num_heads, spec.num_kv_heads, spec.head_dim) == \
        (640, 2048, 4, 1, 256)
    assert spec.vocab_size == 262_144 and spec.max_context == 32_768 and spec.tie_embeddings
    assert spec.bos_token_id == 2 and set(spec.eos_token_ids) == {1, 106}
    assert spec.scale == pytest.approx(256 ** -0.5) and spec.embed_scale == pytest.approx(640 ** 0.5)
    assert spec.qk_norm and spec.sandwich_norm and spec.activation == "gelu_tanh"


def test_gguf_load_shapes_and_dtypes(muser_gguf):
    spec, w, _ = muser_gguf
    assert w.embed.shape == (262_144, 640) and w.lm_head is None
    lw = w.layers[0]
    assert lw.wq.shape == (1024, 640) and lw.wk.shape == (256, 640) and lw.wo.shape == (640, 1024)
    assert lw.w_gate.shape == (2048, 640) and lw.w_down.shape == (640, 2048)
    assert lw.q_norm.shape == (256,) and lw.post_ffn_norm.shape == (640,)
    bf = w.to(None, torch.bfloat16)
    assert bf.embed.dtype == torch.bfloat16 and bf.layers[3].attn_norm.dtype == torch.float32
    assert bf.nbytes() < w.nbytes()


CHECK_LAYERS = (0, 1, 2, 3, 4, 5, 6, 11, 16)


@pytest.mark.slow
def test_hidden_states_match_transformers(muser_gguf, hf_reference, one_thread):
    """Per-layer hidden states and last logits agree with transformers on a prompt longer
    than the 512 window -- this is what shows the GGUF norms already include Gemma's +1."""
    spec, w, _ = muser_gguf
    g = torch.Generator().manual_seed(0)
    ids = torch.cat([torch.tensor([2]), torch.randint(3, 200_000, (599,), generator=g)])

    def compute(model):
        out = model(ids[None], output_hidden_states=True, logits_to_keep=1)
        return {"ids": ids, "norm0": model.model.layers[0].input_layernorm.weight.detach().clone(),
                "hidden": {i: out.hidden_states[i + 1][0].clone() for i in CHECK_LAYERS},
                "logits": out.logits[0, -1].clone()}
    ref = hf_reference("hidden600", compute)
    assert torch.equal(ref["ids"], ids)
    # transformers subtracts 1 from the GGUF's norms and adds it back at run time
    assert torch.allclose(ref["norm0"] + 1, w.layers[0].attn_norm)
    from muser.attention.reference import attention, visibility_mask
    pos = torch.arange(len(ids))
    h = tf.embed(w, spec, ids)
    with torch.no_grad():
        for i, (lw, ls) in enumerate(zip(w.layers, spec.layers)):
            mask = visibility_mask(pos, pos, ls.window)
            h = tf.layer_forward(lw, spec, ls, h, pos, lambda q, k, v: attention(q, k, v, mask, spec.scale))
            if i in ref["hidden"]:
                want = ref["hidden"][i]
                assert torch.allclose(h, want, rtol=1e-4, atol=1e-4 * want.abs().max().item()), f"layer {i}"
        got = tf.logits(w, spec, tf.final_hidden(w, spec, h[-1:]))[0]
    assert torch.allclose(got, ref["logits"], atol=1e-3, rtol=1e-4)
    assert got.argmax() == ref["logits"].argmax()


def test_the_embedded_model_holds_its_head_once_under_the_cuda_default(gguf_path):
    """CUDA's default on the embedded 270M (defaults.default_head; the decision and the weights
    need no GPU): the tied head is kept as its exact Q8_0 blocks and the lookup reads them too
    -- the bf16 table's 335 MB gone, 178 MB of blocks in their place -- and every lookup (a
    spread of ids, the first and last) is the bf16 table's row, bit for bit."""
    from muser.backends.cuda.weights_int8 import EmbedBlocks
    from muser.backends.defaults import default_head
    from muser.config import EngineConfig
    from muser.env import Env
    from muser.model.gguf_loader import load_gguf
    spec, w, _ = load_gguf(gguf_path, dtype=torch.bfloat16, progress=False)
    table, before = w.embed, w.nbytes()
    config = default_head(EngineConfig(device="cuda", dtype="bfloat16"), spec, w, Env())
    assert config.quant == "int8-head" and isinstance(w.embed, EmbedBlocks)
    assert table.shape == (262144, 640) and w.embed.blocks is w.lm_head
    assert before - w.nbytes() == 262144 * 640 * 2 - w.lm_head.nbytes()
    assert w.lm_head.nbytes() == 262144 * 640 + 2 * 262144 * 20            # ~178 MB
    ids = torch.cat([torch.arange(0, 262144, 997), torch.tensor([262143, 2, 2])])
    float_table = replace(w, embed=table, lm_head=None)
    assert torch.equal(tf.embed(w, spec, ids), tf.embed(float_table, spec, ids))


def test_the_embedded_heads_q8_0_blocks_come_back_exactly(gguf_path):
    """The embedded 270M stores its (tied) head as Q8_0: dequantized, then quantized again, it
    is its own blocks -- so quant="int8-head" computes the bf16 engine's weights exactly."""
    from muser.backends.cuda.weights_int8 import quantize_blocks
    from muser.model.gguf_file import GGUFFile
    qs, scales = raw_q8_0(GGUFFile(gguf_path), "token_embd.weight")
    assert qs.shape[0] == 262144
    for r in range(0, qs.shape[0], 32768):    # every row, a slab at a time (~7 s, ~0.3 GB)
        q, sc = qs[r:r + 32768], scales[r:r + 32768]
        w = (q.float().view(q.shape[0], -1, 32) * sc[..., None]).reshape(q.shape[0], -1)
        b = quantize_blocks(w)
        assert torch.equal(b.q, q) and torch.equal(b.scale.float(), sc), r
        wb = w.to(torch.bfloat16)              # as the engine holds it when the backend quantizes
        assert torch.equal(quantize_blocks(wb).dequantized(torch.bfloat16), wb), r
