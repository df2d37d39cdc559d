"""gpt-oss from GGUF: llama.cpp's tensor names and layout (gate / up / down experts split,
[E, out, in], MXFP4), written here with gguf-py's own writer and quantizer from a tiny
transformers checkpoint; loaded logits == transformers with the same (dequantized) experts.

No real llama.cpp-converted gpt-oss file is available offline: this pins the loader to the
layout gguf-py's constants name, and MXFP4 to gguf-py's own dequantization."""
from __future__ import annotations

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

from gguf import GGMLQuantizationType as Q                       # noqa: E402
from gguf.quants import dequantize as np_dequantize, quantize     # noqa: E402

from muser.model.gguf_loader import load_gguf                     # noqa: E402
from muser.model.transformer import forward_reference             # noqa: E402
from muser.testing import tiny_model_dir                          # noqa: E402


def _write(hf, path):
    c = hf.config
    w = gguf.GGUFWriter(str(path), "gpt-oss")
    a = "gpt-oss"
    w.add_uint32(f"{a}.block_count", c.num_hidden_layers)
    w.add_uint32(f"{a}.context_length", c.max_position_embeddings)
    w.add_uint32(f"{a}.embedding_length", c.hidden_size)
    w.add_uint32(f"{a}.feed_forward_length", c.intermediate_size)
    w.add_uint32(f"{a}.expert_feed_forward_length", c.intermediate_size)
    w.add_uint32(f"{a}.attention.head_count", c.num_attention_heads)
    w.add_uint32(f"{a}.attention.head_count_kv", c.num_key_value_heads)
    w.add_uint32(f"{a}.attention.key_length", c.head_dim)
    w.add_uint32(f"{a}.attention.value_length", c.head_dim)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", c.rms_norm_eps)
    w.add_uint32(f"{a}.attention.sliding_window", c.sliding_window)
    w.add_uint32(f"{a}.expert_count", c.num_local_experts)
    w.add_uint32(f"{a}.expert_used_count", c.num_experts_per_tok)
    rp = c.rope_parameters
    w.add_float32(f"{a}.rope.freq_base", rp["rope_theta"])
    w.add_string(f"{a}.rope.scaling.type", "yarn")
    w.add_float32(f"{a}.rope.scaling.factor", rp["factor"])
    w.add_uint32(f"{a}.rope.scaling.original_context_length", rp["original_max_position_embeddings"])
    sd = {k: v.detach().float() for k, v in hf.state_dict().items()}
    f32 = lambda t: np.ascontiguousarray(t.numpy().astype(np.float32))            # noqa: E731
    w.add_tensor("token_embd.weight", f32(sd["model.embed_tokens.weight"]))
    w.add_tensor("output_norm.weight", f32(sd["model.norm.weight"]))
    w.add_tensor("output.weight", f32(sd["lm_head.weight"]))
    names = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "post_attention_norm.weight",
             "self_attn.sinks": "attn_sinks.weight", "mlp.router.weight": "ffn_gate_inp.weight",
             "mlp.router.bias": "ffn_gate_inp.bias"}
    for p in ("q", "k", "v", "o"):
        gname = "attn_output" if p == "o" else f"attn_{p}"
        names[f"self_attn.{p}_proj.weight"], names[f"self_attn.{p}_proj.bias"] = f"{gname}.weight", f"{gname}.bias"
    dequantized = {}
    for i in range(c.num_hidden_layers):
        pre = f"model.layers.{i}."
        for hf_name, g_name in names.items():
            w.add_tensor(f"blk.{i}.{g_name}", f32(sd[pre + hf_name]))
        gu = sd[pre + "mlp.experts.gate_up_proj"].transpose(1, 2)          # [E, 2I, hidden], gate/up interleaved
        gub = sd[pre + "mlp.experts.gate_up_proj_bias"]
        mats = {"ffn_gate_exps": gu[:, 0::2], "ffn_up_exps": gu[:, 1::2],
                "ffn_down_exps": sd[pre + "mlp.experts.down_proj"].transpose(1, 2)}   # [E, out, in]
        for g_name, m in mats.items():
            q = quantize(f32(m), Q.MXFP4)
            w.add_tensor(f"blk.{i}.{g_name}.weight", q, raw_shape=q.shape, raw_dtype=Q.MXFP4)
            dequantized[(i, g_name)] = torch.from_numpy(np_dequantize(q, Q.MXFP4))   # gguf's own
        w.add_tensor(f"blk.{i}.ffn_gate_exps.bias", f32(gub[:, 0::2]))
        w.add_tensor(f"blk.{i}.ffn_up_exps.bias", f32(gub[:, 1::2]))
        w.add_tensor(f"blk.{i}.ffn_down_exps.bias", f32(sd[pre + "mlp.experts.down_proj_bias"]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dequantized


def test_gpt_oss_gguf_with_mxfp4_experts_matches_transformers(tmp_path):
    path = tiny_model_dir("gpt_oss", layers=4, window=5, tokenizer=False)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                           attn_implementation="eager").eval()
    dq = _write(hf, tmp_path / "tiny.gguf")
    with torch.no_grad():                                   # transformers with the same MXFP4 experts
        for i, layer in enumerate(hf.model.layers):
            gu = torch.empty_like(layer.mlp.experts.gate_up_proj)           # [E, hidden, 2I]
            gu[:, :, 0::2] = dq[(i, "ffn_gate_exps")].transpose(1, 2)
            gu[:, :, 1::2] = dq[(i, "ffn_up_exps")].transpose(1, 2)
            layer.mlp.experts.gate_up_proj.copy_(gu)
            layer.mlp.experts.down_proj.copy_(dq[(i, "ffn_down_exps")].transpose(1, 2))
    spec, weights, _ = load_gguf(tmp_path / "tiny.gguf", progress=False)
    assert spec.architecture == "gpt_oss" and [l.kind for l in spec.layers] == ["sliding", "full"] * 2
    assert spec.moe.num_experts == 4 and spec.attention_sinks and spec.layers[0].rope_scaling.kind == "yarn"
    assert torch.equal(weights.layers[1].moe.w_down[3], dq[(1, "ffn_down_exps")][3])   # MXFP4 as gguf reads it
    ids = torch.arange(30) * 11 % 384
    with torch.no_grad():
        want = hf(ids[None]).logits[0]
    torch.testing.assert_close(forward_reference(weights, spec, ids), want, rtol=1e-4, atol=1e-4)
