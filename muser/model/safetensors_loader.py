"""Load a HF checkpoint directory (config.json + *.safetensors) into (ModelSpec, Weights).

Owns: HF tensor names -> `Weights` fields for Gemma 3 (also under the
multimodal `model.language_model.` prefix), Cohere2 and Llama/Qwen2/Mistral,
sharded checkpoints (model.safetensors.index.json), and folding Gemma's `+1`
into its norm weights (HF Gemma stores w and applies 1 + w).
Does not own: the layer map (`spec`) or the tokenizer (`tokenizer`).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import safe_open

from muser.config import ModelSpec
from muser.errors import ModelFormatError
from muser.model.spec import spec_from_hf_config
from muser.model.weights import LayerWeights, Weights

# HF per-layer suffix -> LayerWeights field
_LAYER = {
    "input_layernorm.weight": "attn_norm",
    "self_attn.q_proj.weight": "wq", "self_attn.k_proj.weight": "wk",
    "self_attn.v_proj.weight": "wv", "self_attn.o_proj.weight": "wo",
    "self_attn.q_proj.bias": "bq", "self_attn.k_proj.bias": "bk",
    "self_attn.v_proj.bias": "bv", "self_attn.o_proj.bias": "bo",
    "self_attn.q_norm.weight": "q_norm", "self_attn.k_norm.weight": "k_norm",
    "pre_feedforward_layernorm.weight": "pre_ffn_norm",
    "post_feedforward_layernorm.weight": "post_ffn_norm",
    "mlp.gate_proj.weight": "w_gate", "mlp.up_proj.weight": "w_up", "mlp.down_proj.weight": "w_down",
}
# prefixes a text model's tensors may carry (Gemma 3 multimodal: model.language_model.)
_PREFIXES = ("model.language_model.", "language_model.model.", "model.", "")
_SKIP = re.compile(r"(rotary_emb|vision_tower|multi_modal_projector|vision_model)")
_LAYER_RE = re.compile(r"layers\.(\d+)\.(.+)$")


def _read_config(path: Path) -> dict:
    try:
        return json.loads((path / "config.json").read_text())
    except FileNotFoundError:
        raise ModelFormatError(f"{path}: no config.json") from None


def _shards(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [path / n for n in names]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelFormatError(f"{path}: no *.safetensors files")
    return files


def _eos_from_generation_config(path: Path) -> tuple[int, ...]:
    try:
        v = json.loads((path / "generation_config.json").read_text()).get("eos_token_id")
    except (FileNotFoundError, json.JSONDecodeError):
        return ()
    if v is None:
        return ()
    return tuple(int(x) for x in (v if isinstance(v, list) else [v]))


def load_hf_dir(path, dtype: torch.dtype = torch.float32,
                max_context: int | None = None) -> tuple[ModelSpec, Weights]:
    """(spec, weights on CPU in `dtype`, norms float32 and effective)."""
    path = Path(path)
    cfg = _read_config(path)
    spec = spec_from_hf_config(cfg, max_context=max_context)
    extra_eos = _eos_from_generation_config(path)
    if extra_eos:
        from dataclasses import replace
        spec = replace(spec, eos_token_ids=tuple(dict.fromkeys(spec.eos_token_ids + extra_eos)))
    gemma = spec.architecture == "gemma3"
    top: dict[str, torch.Tensor] = {}
    per_layer: list[dict[str, torch.Tensor]] = [{} for _ in range(spec.num_layers)]
    for shard in _shards(path):
        with safe_open(str(shard), framework="pt") as f:
            for key in f.keys():
                if _SKIP.search(key):
                    continue
                _place(key, f.get_tensor(key), spec, gemma, dtype, top, per_layer)
    if "embed" not in top or "final_norm" not in top:
        raise ModelFormatError(f"{path}: checkpoint lacks the embedding or the final norm")
    try:
        layers = [LayerWeights(**d) for d in per_layer]
    except TypeError as e:
        raise ModelFormatError(f"{path}: checkpoint is missing layer tensors: {e}") from None
    lm_head = None if spec.tie_embeddings else top.get("lm_head")
    if not spec.tie_embeddings and lm_head is None:
        raise ModelFormatError(f"{path}: untied model without lm_head.weight")
    return spec, Weights(embed=top["embed"], final_norm=top["final_norm"], layers=layers, lm_head=lm_head)


def _place(key, t, spec, gemma, dtype, top, per_layer) -> None:
    name = key
    for p in _PREFIXES:
        if key.startswith(p):
            name = key[len(p):]
            break
    is_norm = name.endswith("norm.weight") or name.endswith("layernorm.weight")
    # Gemma applies (1 + w): store the effective multiplier, computed in float32
    t = (t.float() + 1.0) if (gemma and is_norm) else t.to(torch.float32 if is_norm else dtype)
    if key.startswith("lm_head.") or name == "lm_head.weight":
        top["lm_head"] = t
        return
    if name == "embed_tokens.weight":
        top["embed"] = t
        return
    if name == "norm.weight":
        top["final_norm"] = t
        return
    m = _LAYER_RE.match(name)
    if m is None:
        raise ModelFormatError(f"tensor {key!r} has no place in muser's weights")
    i, suffix = int(m.group(1)), m.group(2)
    field = _LAYER.get(suffix)
    if suffix == "post_attention_layernorm.weight":
        # Gemma: the sandwich norm after attention; Llama family: the norm before the MLP
        field = "post_attn_norm" if spec.sandwich_norm else "pre_ffn_norm"
    if field is None:
        raise ModelFormatError(f"tensor {key!r} has no place in muser's weights")
    if i >= spec.num_layers:
        raise ModelFormatError(f"tensor {key!r}: layer {i} >= num_layers {spec.num_layers}")
    per_layer[i][field] = t
