"""Gemma 4 from GGUF, written as llama.cpp's converter (`Gemma4Model`, conversion/gemma.py) writes
it: per-layer flags, head dims and kv heads as arrays, `shared_kv_layers`, proportional RoPE as a
`rope_freqs` tensor, no +1 on the norms, V = K where a full layer has no attn_v.  Written here
with gguf-py (names from its own `TensorNameMap`) from the tiny transformers checkpoint; loaded
back, the spec and every weight equal the safetensors load, bit for bit, and so do the logits.

No real llama.cpp-converted Gemma 4 file is available offline: this pins the loader to the
converter's code as read, not to a file it produced."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from muser.errors import ModelFormatError                          # noqa: E402
from muser.model.gguf_loader import load_gguf                      # noqa: E402
from muser.model.safetensors_loader import load_hf_dir             # noqa: E402
from muser.testing import tiny_model_dir                           # noqa: E402


def _write(src, path, drop=()):
    from safetensors import safe_open
    cfg = json.loads((src / "config.json").read_text())
    n, types = cfg["num_hidden_layers"], cfg["layer_types"]
    over = {int(k): v for k, v in (cfg.get("per_layer_config") or {}).items()}
    full = next(i for i, t in enumerate(types) if t == "full_attention")
    head_swa = cfg["head_dim"]
    head_full = cfg.get("global_head_dim") or over.get(full, {}).get("head_dim", head_swa)
    kv_full = cfg.get("num_global_key_value_heads") if cfg.get("attention_k_eq_v") else None
    kv = [over.get(i, {}).get("num_key_value_heads", kv_full if t == "full_attention" and kv_full
                              else cfg["num_key_value_heads"]) for i, t in enumerate(types)]
    shared = cfg["num_kv_shared_layers"]
    ffn = cfg["intermediate_size"]
    if cfg.get("use_double_wide_mlp"):               # as the converter writes it
        ffn = [ffn if i < n - shared else 2 * ffn for i in range(n)]
    w = gguf.GGUFWriter(str(path), "gemma4")
    w.add_block_count(n)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(ffn)
    w.add_head_count(cfg["num_attention_heads"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg["rope_parameters"]["full_attention"]["rope_theta"])
    if cfg.get("final_logit_softcapping"):
        w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    w.add_sliding_window(cfg["sliding_window"])
    w.add_shared_kv_layers(shared)
    w.add_embedding_length_per_layer_input(cfg["hidden_size_per_layer_input"])
    w.add_sliding_window_pattern([t == "sliding_attention" for t in types])
    w.add_key_length(head_full)
    w.add_value_length(head_full)
    w.add_key_length_swa(head_swa)
    w.add_value_length_swa(head_swa)
    w.add_head_count_kv(kv)
    w.add_rope_dimension_count(head_full)
    w.add_rope_dimension_count_swa(head_swa)
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    if cfg.get("enable_moe_block"):
        w.add_expert_count(cfg["num_experts"])
        w.add_expert_used_count(cfg["top_k_experts"])
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    partial = cfg["rope_parameters"]["full_attention"]["partial_rotary_factor"]
    rot = int(head_full * partial / 2)
    w.add_tensor("rope_freqs.weight", np.array([1.0] * rot + [1e30] * (head_full // 2 - rot), np.float32))
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA4, n)
    with safe_open(str(next(src.glob("*.safetensors"))), "pt") as f:
        for key in f.keys():
            bid = key.split(".layers.")[1].split(".")[0] if ".layers." in key else None
            if key.endswith("router.scale"):               # the converter's own two names
                name = f"blk.{bid}.ffn_gate_inp.scale"
            elif key.endswith("router.per_expert_scale"):
                name = f"blk.{bid}.ffn_down_exps.scale"
            else:
                hf = key + ".weight" if key.endswith("layer_scalar") or (
                    ".experts." in key and not key.endswith(".weight")) else key
                name = names.get_name(hf, try_suffixes=(".weight", ".bias"))
            if name in drop:
                continue
            w.add_tensor(name, np.ascontiguousarray(f.get_tensor(key).float().numpy()))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _compare(src, path):
    spec_h, w_h = load_hf_dir(src, dtype=torch.float32)
    spec_g, w_g, _ = load_gguf(path, dtype=torch.float32, progress=False)
    # GGUF stores the norm's epsilon as float32: the same float32 the norm adds
    assert np.float32(spec_g.norm_eps) == np.float32(spec_h.norm_eps)
    assert dataclasses.replace(spec_g, eos_token_ids=spec_h.eos_token_ids, norm_eps=spec_h.norm_eps,
                               intermediate_size=spec_h.intermediate_size) == spec_h
    for field in ("embed", "final_norm", "per_layer_embed", "per_layer_proj", "per_layer_norm"):
        x, y = getattr(w_g, field), getattr(w_h, field)
        assert (x is None and y is None) or torch.equal(x, y), field
    for i, (a, b) in enumerate(zip(w_g.layers, w_h.layers)):
        _same(a, b, f"layer {i}")
    return spec_g


def _same(x, y, where):
    """Tensors equal bit for bit (and in dtype), through dataclasses (experts) and lists."""
    assert (x is None) == (y is None), where
    if isinstance(x, torch.Tensor):
        assert x.dtype == y.dtype and torch.equal(x, y), where
    elif isinstance(x, (list, tuple)):
        assert len(x) == len(y), where
        for k, (p, q) in enumerate(zip(x, y)):
            _same(p, q, f"{where}[{k}]")
    elif dataclasses.is_dataclass(x):
        for f in dataclasses.fields(x):
            _same(getattr(x, f.name), getattr(y, f.name), f"{where}.{f.name}")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    src = tiny_model_dir("gemma4", tokenizer=False)
    path = tmp_path_factory.mktemp("g4") / "tiny-gemma4.gguf"
    _write(src, path)
    return src, path


def test_the_gguf_spec_and_weights_equal_the_safetensors_load(tiny):
    spec = _compare(*tiny)
    assert [(l.kind, l.kv_source, l.k_eq_v) for l in spec.layers][-2:] == [("sliding", 3, False), ("full", 2, True)]


@pytest.mark.parametrize("variant", [
    dict(attention_k_eq_v=False, use_double_wide_mlp=True, num_kv_shared_layers=2, hidden_size_per_layer_input=4),
    dict(attention_k_eq_v=False, num_kv_shared_layers=0, hidden_size_per_layer_input=0, global_head_dim=16),
])
def test_gemma4_variants_from_gguf(variant, tmp_path):
    """Own V projections, the double-wide MLP of KV-shared layers (a per-layer width array), no
    per-layer inputs, no sharing: each GGUF loads to the safetensors spec and weights."""
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig
    kw = dict(dict(global_head_dim=32), **variant)
    cfg = Gemma4TextConfig(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=6,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=5,
                           layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
                           vocab_size_per_layer_input=300, max_position_embeddings=256, **kw)
    torch.manual_seed(0)
    Gemma4ForCausalLM(cfg).float().save_pretrained(tmp_path / "hf")
    _write(tmp_path / "hf", tmp_path / "m.gguf")
    _compare(tmp_path / "hf", tmp_path / "m.gguf")


@pytest.mark.parametrize("arch", ["gemma4", "gemma4_moe"])
def test_the_gguf_model_computes_the_safetensors_models_logits(arch, tmp_path):
    from muser.engine.engine import Engine
    from muser.config import EngineConfig
    src, path = tiny_model_dir(arch, tokenizer=False), tmp_path / "m.gguf"
    _write(src, path)
    ids = [(7 * j) % 300 + 3 for j in range(19)]
    out = []
    for spec, w in (load_hf_dir(src, dtype=torch.float32), load_gguf(path, dtype=torch.float32, progress=False)[:2]):
        e = Engine("g4", spec, w, None, EngineConfig(device="cpu", dtype="float32"), "digest")
        out.append(e.new_session().prefill(ids))
    assert torch.equal(out[0], out[1])


def test_gemma4_with_experts_from_gguf(tmp_path):
    """The 26B-A4B layout: experts beside the MLP, fused gate/up, the router's two scales."""
    src = tiny_model_dir("gemma4_moe", tokenizer=False)
    _write(src, tmp_path / "moe.gguf")
    spec = _compare(src, tmp_path / "moe.gguf")
    assert spec.moe is not None and spec.moe.num_experts == 4


@pytest.mark.parametrize("drop, needle", [
    (("per_layer_model_proj.weight",), "per-layer input"),
    (("blk.1.ffn_down_exps.scale",), "expert_scale"),
])
def test_a_gguf_missing_what_the_header_promises_is_refused_by_name(tmp_path, drop, needle):
    src = tiny_model_dir("gemma4_moe", tokenizer=False)
    _write(src, tmp_path / "bad.gguf", drop=drop)
    with pytest.raises(ModelFormatError, match=needle):
        load_gguf(tmp_path / "bad.gguf", dtype=torch.float32, progress=False)


def test_muser_load_takes_the_tokenizer_beside_a_file_whose_own_it_cannot_read(tmp_path):
    import shutil
    import muser
    src = tiny_model_dir("gemma4")                    # with tokenizer files
    bare, beside = tmp_path / "bare" / "m.gguf", tmp_path / "beside" / "m.gguf"
    for p in (bare, beside):
        p.parent.mkdir()
        _write(src, p)                                # no tokenizer metadata in the file
    for f in src.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(f, beside.parent / f.name)
    with pytest.warns(UserWarning, match="without one"):
        e = muser.load(str(bare), dtype="float32", progress=False)
    assert not e.has_tokenizer and e.new_session().prefill([5, 6, 7]).shape == (384,)
    with pytest.warns(UserWarning, match="beside it"):
        e = muser.load(str(beside), dtype="float32", progress=False)
    assert e.tokenizer.encode("hello world", add_bos=False)
