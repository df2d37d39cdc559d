"""Load a HF checkpoint directory (config.json + *.safetensors) into (ModelSpec, Weights).

Owns: HF tensor names -> `Weights` fields for Gemma 3 / Gemma 4 (also under the
multimodal `model.language_model.` prefix), gpt-oss, OLMo 3, EXAONE 4, Cohere2 and
Llama/Qwen2/Mistral/Ministral, sharded checkpoints (model.safetensors.index.json),
folding Gemma 3's `+1` into its norm weights (HF Gemma 3 stores w and applies
1 + w; Gemma 4 stores the multiplier itself), and experts: gpt-oss's stacked
[E, in, out] tensors with interleaved gate/up columns (or their MXFP4
`_blocks`/`_scales` form, dequantized) and Gemma 4's [E, out, in] ones, split
into one [out, in] matrix per expert (`weights.MoeWeights`).
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
from muser.model.dequant import mxfp4_hf
from muser.model.weights import LayerWeights, MoeWeights, Weights, aligned, missing

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
    "self_attn.sinks": "sinks",                                                 # gpt-oss
    "per_layer_input_gate.weight": "ple_gate", "per_layer_projection.weight": "ple_proj",   # Gemma 4
    "post_per_layer_input_norm.weight": "ple_norm", "layer_scalar": "layer_scale",
}
# HF per-layer suffix -> expert/router tensor (collected, then split per expert)
_MOE = {
    "mlp.router.weight": "router", "mlp.router.bias": "router_bias",            # gpt-oss
    "mlp.experts.gate_up_proj": "gate_up", "mlp.experts.gate_up_proj_bias": "gate_up_bias",
    "mlp.experts.down_proj": "down", "mlp.experts.down_proj_bias": "down_bias",
    "mlp.experts.gate_up_proj_blocks": "gate_up_blocks", "mlp.experts.gate_up_proj_scales": "gate_up_scales",
    "mlp.experts.down_proj_blocks": "down_blocks", "mlp.experts.down_proj_scales": "down_scales",
    "router.proj.weight": "router", "router.scale": "router_scale",             # Gemma 4
    "router.per_expert_scale": "expert_scale",
    "experts.gate_up_proj": "gate_up", "experts.down_proj": "down",
    "post_feedforward_layernorm_1.weight": "post_dense_norm",
    "pre_feedforward_layernorm_2.weight": "pre_moe_norm",
    "post_feedforward_layernorm_2.weight": "post_moe_norm",
}
_TOP = {"embed_tokens.weight": "embed", "norm.weight": "final_norm",
        "embed_tokens_per_layer.weight": "per_layer_embed",                    # Gemma 4 PLE
        "per_layer_model_projection.weight": "per_layer_proj",
        "per_layer_projection_norm.weight": "per_layer_norm"}
# prefixes a text model's tensors may carry (Gemma 3 multimodal: model.language_model.)
_PREFIXES = ("model.language_model.", "language_model.model.", "model.", "")
_SKIP = re.compile(r"(rotary_emb|vision_tower|multi_modal_projector|vision_model|audio_tower|embed_vision|"
                   r"embed_audio)")
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

    def tensors():
        for shard in _shards(path):
            with safe_open(str(shard), framework="pt") as f:
                for key in f.keys():
                    yield key, f.get_tensor(key)
    return load_hf_tensors(_read_config(path), tensors(), dtype, max_context,
                           _eos_from_generation_config(path), where=str(path))


def load_hf_tensors(cfg: dict, tensors, dtype: torch.dtype = torch.float32,
                    max_context: int | None = None, extra_eos: tuple[int, ...] = (),
                    where: str = "state dict") -> tuple[ModelSpec, Weights]:
    """A transformers config (dict) and its (name, tensor) pairs -> (spec, weights).  Tensors
    stay where they are (a GPU state dict loads without a host copy); a tensor already in
    `dtype` and aligned is used as is, shared with its source."""
    spec = spec_from_hf_config(cfg, max_context=max_context)
    if extra_eos:
        from dataclasses import replace
        spec = replace(spec, eos_token_ids=tuple(dict.fromkeys(spec.eos_token_ids + extra_eos)))
    gemma = spec.architecture == "gemma3"
    top: dict[str, torch.Tensor] = {}
    per_layer: list[dict] = [{} for _ in range(spec.num_layers)]
    for key, t in tensors:
        if _SKIP.search(key):
            continue
        _place(key, t, spec, gemma, dtype, top, per_layer)
    if "embed" not in top or "final_norm" not in top:
        raise ModelFormatError(f"{where}: checkpoint lacks the embedding or the final norm")
    layers = []
    for i, d in enumerate(per_layer):
        raw = d.pop("_moe", None)
        if raw is not None:
            d["moe"] = stacked_experts(raw, spec, dtype, i)
        try:
            lw = LayerWeights(**d)
        except TypeError as e:
            raise ModelFormatError(f"{where}: checkpoint is missing layer tensors: {e}") from None
        gaps = missing(lw, spec, spec.layers[i])
        if gaps:
            raise ModelFormatError(f"{where}: layer {i} lacks {', '.join(gaps)}")
        layers.append(lw)
    lm_head = None if spec.tie_embeddings else top.get("lm_head")
    if not spec.tie_embeddings and lm_head is None:
        raise ModelFormatError(f"{where}: untied model without lm_head.weight")
    if spec.per_layer_input and any(top.get(k) is None for k in ("per_layer_embed", "per_layer_proj",
                                                                   "per_layer_norm")):
        raise ModelFormatError(f"{where}: Gemma 4 checkpoint lacks its per-layer input embeddings")
    return spec, Weights(embed=top["embed"], final_norm=top["final_norm"], layers=layers, lm_head=lm_head,
                         per_layer_embed=top.get("per_layer_embed"), per_layer_proj=top.get("per_layer_proj"),
                         per_layer_norm=top.get("per_layer_norm"))


def _place(key, t, spec, gemma, dtype, top, per_layer) -> None:
    name = key
    for p in _PREFIXES:
        if key.startswith(p):
            name = key[len(p):]
            break
    is_norm = name.endswith("norm.weight") or name.endswith("layernorm.weight")
    m = _LAYER_RE.match(name)
    suffix = m.group(2) if m else None
    if suffix in _MOE:                          # experts keep their raw dtype until split
        per_layer[_layer(key, m, spec)].setdefault("_moe", {})[_MOE[suffix]] = aligned(t)
        return
    # Gemma 3 applies (1 + w): store the effective multiplier, computed in float32
    t = aligned((t.float() + 1.0) if (gemma and is_norm) else t.to(torch.float32 if is_norm else dtype))
    if key.startswith("lm_head.") or name == "lm_head.weight":
        top["lm_head"] = t
        return
    if name in _TOP:
        top[_TOP[name]] = t
        return
    if m is None:
        raise ModelFormatError(f"tensor {key!r} has no place in muser's weights")
    field = _LAYER.get(suffix)
    if suffix == "post_attention_layernorm.weight":
        # Gemma / OLMo 3 / EXAONE 4: the norm after attention; Llama family: the norm before the MLP
        field = "post_attn_norm" if spec.sandwich_norm or not spec.pre_norm else "pre_ffn_norm"
    if field is None:
        raise ModelFormatError(f"tensor {key!r} has no place in muser's weights")
    per_layer[_layer(key, m, spec)][field] = t


def _layer(key, m, spec) -> int:
    i = int(m.group(1))
    if i >= spec.num_layers:
        raise ModelFormatError(f"tensor {key!r}: layer {i} >= num_layers {spec.num_layers}")
    return i


def stacked_experts(raw: dict, spec, dtype, layer: int) -> MoeWeights:
    """One layer's stacked expert tensors -> a `MoeWeights` of per-expert [out, in] matrices
    (also Gemma 4's experts from GGUF, whose tensors gguf_loader names by the same roles)."""
    ms = spec.moe
    if ms is None:
        raise ModelFormatError(f"layer {layer}: expert tensors but the config enables no experts")
    E, f32 = ms.num_experts, torch.float32
    for name in ("gate_up", "down"):                 # MXFP4 (gpt-oss as released): already [E, out, in]
        if f"{name}_blocks" in raw:
            raw[name] = mxfp4_hf(raw.pop(f"{name}_blocks"), raw.pop(f"{name}_scales"), f32)
            raw[f"_{name}_out_in"] = True
    try:
        gate_up, down, router = raw["gate_up"], raw["down"], raw["router"]
    except KeyError as e:
        raise ModelFormatError(f"layer {layer}: experts lack {e.args[0]}") from None
    if gate_up.shape[0] != E or down.shape[0] != E:
        raise ModelFormatError(f"layer {layer}: expected {E} experts, got {gate_up.shape[0]} / {down.shape[0]}")
    if ms.style == "gpt_oss":
        # bf16 checkpoints: [E, in, out] with gate/up interleaved along out; MXFP4: [E, out, in]
        gu = gate_up if raw.get("_gate_up_out_in") else gate_up.transpose(1, 2)     # [E, 2I, hidden]
        dn = down if raw.get("_down_out_in") else down.transpose(1, 2)              # [E, hidden, I]
        gub = raw.get("gate_up_bias")
        if gub is None or raw.get("down_bias") is None or raw.get("router_bias") is None:
            raise ModelFormatError(f"layer {layer}: gpt-oss experts lack their biases")
        return MoeWeights(
            router=router.to(dtype), router_bias=raw["router_bias"].to(dtype),
            w_gate=[gu[e, 0::2].to(dtype).contiguous() for e in range(E)],
            w_up=[gu[e, 1::2].to(dtype).contiguous() for e in range(E)],
            w_down=[dn[e].to(dtype).contiguous() for e in range(E)],
            b_gate=gub[:, 0::2].to(dtype).contiguous(), b_up=gub[:, 1::2].to(dtype).contiguous(),
            b_down=raw["down_bias"].to(dtype))
    # Gemma 4: gate_up [E, 2I, hidden] (gate rows first), down [E, hidden, I]
    inter = gate_up.shape[1] // 2
    need = ("router_scale", "expert_scale", "post_dense_norm", "pre_moe_norm", "post_moe_norm")
    lack = [n for n in need if n not in raw]
    if lack:
        raise ModelFormatError(f"layer {layer}: Gemma 4 experts lack {', '.join(lack)}")
    return MoeWeights(
        router=router.to(dtype), w_gate=[gate_up[e, :inter].to(dtype) for e in range(E)],
        w_up=[gate_up[e, inter:].to(dtype) for e in range(E)], w_down=[down[e].to(dtype) for e in range(E)],
        expert_scale=raw["expert_scale"].float(),
        # the router's input is RMS(h) * scale * hidden^-0.5: one effective norm multiplier
        router_norm=raw["router_scale"].float() * spec.hidden_size ** -0.5,
        post_dense_norm=raw["post_dense_norm"].float(), pre_moe_norm=raw["pre_moe_norm"].float(),
        post_moe_norm=raw["post_moe_norm"].float())
