"""muser's functional transformer == transformers' eager models, on tiny random checkpoints.

Each model is built by transformers, saved as safetensors, loaded back with
`load_hf_dir`, and run by `transformer.forward_reference` (full recompute with
the reference attention and the window from the spec) on a prompt several
times longer than the sliding window.
"""
from __future__ import annotations

import pytest
import torch

from muser.model.safetensors_loader import load_hf_dir
from muser.model.transformer import forward_reference

transformers = pytest.importorskip("transformers")

VOCAB, T, WINDOW = 300, 40, 6


def _randomize_norms(model):
    # HF initializes Gemma norms to 0 (multiplier 1) and Cohere's to 1: perturb them so
    # a missing or double "+1" cannot hide.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.3)


def _check(model, tmp_path, expect_arch, **save_kw):
    torch.manual_seed(0)
    _randomize_norms(model)
    model.eval()
    model.save_pretrained(tmp_path, safe_serialization=True, **save_kw)
    spec, weights = load_hf_dir(tmp_path, dtype=torch.float32)
    assert spec.architecture == expect_arch
    ids = torch.randint(0, VOCAB, (T,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(ids[None]).logits[0].float()
        got = forward_reference(weights, spec, ids)
    assert got.shape == want.shape
    err = (got - want).abs().max().item()
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), f"max abs err {err}"
    return spec, weights


def test_gemma3_tiny(tmp_path):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    types = ["sliding_attention", "sliding_attention", "full_attention",
             "sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]
    cfg = Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=len(types),
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, sliding_window=WINDOW,
        layer_types=types, max_position_embeddings=256, query_pre_attn_scalar=24,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                         "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1_000_000.0}},
        final_logit_softcapping=30.0, attn_logit_softcapping=50.0,
        attn_implementation="eager", tie_word_embeddings=True, eos_token_id=[1, 106])
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(cfg).float()
    spec, weights = _check(model, tmp_path, "gemma3")
    assert [l.kind for l in spec.layers] == ["full" if t == "full_attention" else "sliding" for t in types]
    assert spec.layers[2].rope_scale == 2.0 and spec.layers[0].rope_scale == 1.0
    assert spec.layers[2].rope_theta == 1e6 and spec.layers[0].rope_theta == 1e4
    assert spec.query_scale == pytest.approx(24 ** -0.5)
    assert weights.lm_head is None and spec.eos_token_ids == (1, 106)


def test_cohere2_tiny(tmp_path):
    from transformers import Cohere2Config, Cohere2ForCausalLM
    cfg = Cohere2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
        num_attention_heads=4, num_key_value_heads=2, sliding_window=WINDOW,
        max_position_embeddings=256, logit_scale=0.5, attn_implementation="eager")
    torch.manual_seed(0)
    model = Cohere2ForCausalLM(cfg).float()
    spec, _ = _check(model, tmp_path, "cohere2")
    kinds = [(l.kind, l.rope) for l in spec.layers]
    assert kinds == [("sliding", True)] * 3 + [("full", False)] + [("sliding", True)] * 3 + [("full", False)]
    assert spec.parallel_block and spec.rope_interleaved and spec.norm == "layernorm"


def test_llama_tiny(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      attn_implementation="eager", tie_word_embeddings=False)
    torch.manual_seed(0)
    spec, weights = _check(LlamaForCausalLM(cfg).float(), tmp_path, "llama", max_shard_size="60KB")
    assert (tmp_path / "model.safetensors.index.json").exists()         # sharded checkpoint
    assert all(l.kind == "full" and l.rope for l in spec.layers) and weights.lm_head is not None


def test_qwen2_tiny_biases(tmp_path):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      attn_implementation="eager", tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).float()
    with torch.no_grad():                       # HF zero-inits biases: make them count
        for n, p in model.named_parameters():
            if n.endswith("bias"):
                p.normal_(0, 0.5)
    spec, weights = _check(model, tmp_path, "qwen2")
    assert spec.attention_bias and weights.layers[0].bq is not None


def test_mistral_sliding_all_layers(tmp_path):
    from transformers import MistralConfig, MistralForCausalLM
    cfg = MistralConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=WINDOW,
                        max_position_embeddings=256, attn_implementation="eager")
    torch.manual_seed(0)
    spec, _ = _check(MistralForCausalLM(cfg).float(), tmp_path, "mistral")
    assert all(l.kind == "sliding" and l.window == WINDOW for l in spec.layers)


def test_gemma3_multimodal_config_and_prefix(tmp_path):
    """A `gemma3` config with text_config, tensors under model.language_model."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    import json
    from safetensors.torch import save_file
    cfg = Gemma3TextConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=32, sliding_window=WINDOW,
                           max_position_embeddings=256, attn_implementation="eager")
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(cfg).float().eval()
    _randomize_norms(model)
    sd = {k.replace("model.", "model.language_model.", 1): v.contiguous()
          for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(sd, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "gemma3", "tie_word_embeddings": True, "text_config": cfg.to_dict()}))
    spec, weights = load_hf_dir(tmp_path)
    assert [l.kind for l in spec.layers] == ["sliding"] * 5 + ["full"]     # pattern 6
    ids = torch.arange(T) % VOCAB
    with torch.no_grad():
        want = model(ids[None]).logits[0]
    assert torch.allclose(forward_reference(weights, spec, ids), want, atol=1e-4, rtol=1e-4)


def test_gemma3_tiny_bfloat16_close_to_transformers(tmp_path):
    """bf16 weights and activations (norms and RoPE in float32): close to transformers in bf16."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    cfg = Gemma3TextConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=32, sliding_window=WINDOW,
                           max_position_embeddings=256, attn_implementation="eager")
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(cfg).float().eval()
    _randomize_norms(model)
    model.save_pretrained(tmp_path)
    spec, weights = load_hf_dir(tmp_path, dtype=torch.bfloat16)
    assert weights.embed.dtype == torch.bfloat16 and weights.layers[0].attn_norm.dtype == torch.float32
    ids = torch.arange(T) * 7 % VOCAB
    with torch.no_grad():
        want32 = model(ids[None]).logits[0]
        want16 = model.to(torch.bfloat16)(ids[None]).logits[0].float()
        got = forward_reference(weights, spec, ids)
    assert got.dtype == torch.float32
    # as close to the float32 truth as transformers' own bf16 run is (within 2x)
    assert (got - want32).abs().max() <= 2 * (want16 - want32).abs().max() + 1e-3
