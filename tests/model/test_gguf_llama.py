"""llama-arch GGUF: llama.cpp permutes attn_q / attn_k rows; the loader must undo it.

A tiny random Llama is written to GGUF the way convert_hf_to_gguf.py writes it
(q/k permuted, F32 tensors), loaded by muser, and compared with the HF model it
came from -- and with transformers' own loading of that GGUF.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

from muser.model.gguf_loader import load_gguf  # noqa: E402
from muser.model.transformer import forward_reference  # noqa: E402

VOCAB = 320


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _write_llama_gguf(model, path):
    cfg = model.config
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(10_000.0)
    w.add_vocab_size(VOCAB)
    # a minimal vocabulary so transformers can build a config and tokenizer from the file
    w.add_tokenizer_model("llama")
    w.add_token_list([f"<t{i}>" for i in range(VOCAB)])
    w.add_token_scores([0.0] * VOCAB)
    w.add_token_types([1] * VOCAB)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.add_tensor("output.weight", sd["lm_head.weight"])
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        w.add_tensor(f"blk.{i}.attn_norm.weight", sd[p + "input_layernorm.weight"])
        w.add_tensor(f"blk.{i}.attn_q.weight", _permute(sd[p + "self_attn.q_proj.weight"], cfg.num_attention_heads))
        w.add_tensor(f"blk.{i}.attn_k.weight", _permute(sd[p + "self_attn.k_proj.weight"], cfg.num_key_value_heads))
        w.add_tensor(f"blk.{i}.attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        w.add_tensor(f"blk.{i}.attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        w.add_tensor(f"blk.{i}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        w.add_tensor(f"blk.{i}.ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
        w.add_tensor(f"blk.{i}.ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        w.add_tensor(f"blk.{i}.ffn_down.weight", sd[p + "mlp.down_proj.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      attn_implementation="eager", tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).float().eval()
    path = tmp_path_factory.mktemp("llama") / "tiny-llama.gguf"
    _write_llama_gguf(model, path)
    return model, path


def test_llama_gguf_unpermutes_qk(tiny_llama):
    model, path = tiny_llama
    spec, weights, _ = load_gguf(path, progress=False)
    assert spec.architecture == "llama" and not spec.tie_embeddings
    assert torch.equal(weights.layers[0].wq, model.model.layers[0].self_attn.q_proj.weight)
    assert torch.equal(weights.layers[1].wk, model.model.layers[1].self_attn.k_proj.weight)
    ids = torch.arange(30) * 7 % VOCAB
    with torch.no_grad():
        want = model(ids[None]).logits[0]
    assert torch.allclose(forward_reference(weights, spec, ids), want, atol=1e-5, rtol=1e-5)


def test_llama_gguf_agrees_with_transformers_gguf_loading(tiny_llama):
    """Independent of our writer's permutation: transformers reads the same file the same way."""
    pytest.importorskip("accelerate")
    _, path = tiny_llama
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                           dtype=torch.float32).eval()
    spec, weights, _ = load_gguf(path, progress=False)
    ids = torch.arange(30) * 5 % VOCAB
    with torch.no_grad():
        want = hf(ids[None]).logits[0]
    assert torch.allclose(forward_reference(weights, spec, ids), want, atol=1e-5, rtol=1e-5)


def test_loader_accepts_a_gguf_reader(tiny_llama):
    """spec_from_gguf / load_gguf / raw_q8_0 also take a gguf.GGUFReader (slow on big vocabularies)."""
    _, path = tiny_llama
    spec_a, w_a, _ = load_gguf(path, progress=False)
    spec_b, w_b, _ = load_gguf(gguf.GGUFReader(str(path)), progress=False)
    assert spec_a == spec_b
    assert all(torch.equal(a, b) for a, b in zip(w_a.tensors(), w_b.tensors()))
