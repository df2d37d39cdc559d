"""Load a GGUF file into (ModelSpec, Weights).

Owns: the GGUF tensor names -> `Weights` fields map (gemma3, llama/qwen2, and
gpt-oss: sinks, router, experts stored split gate / up / down as [E, out, in],
MXFP4 dequantized by gguf-py's own code), llama.cpp's q/k row permutation
(undone for the `llama` arch only), and raw Q8_0 access for an int8 path
(`raw_q8_0`).
Does not own: header parsing (`gguf_file`), block formats (`dequant`), the
layer map (`spec`).

Facts this relies on (checked by tests/model/test_gguf.py against transformers):
  * gemma3 GGUFs store norm weights WITH Gemma's +1 folded in (the converter
    adds it), i.e. already effective -- nothing to add here;
  * llama.cpp permutes attn_q / attn_k rows for `llama` so its pairwise RoPE
    works; gemma3 and qwen2 use NEOX-style RoPE and are not permuted.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType

from muser.config import ModelSpec
from muser.errors import ModelFormatError
from muser.model.dequant import dequantize, q8_0_blocks
from muser.model.gguf_file import GGUFFile
from muser.model.safetensors_loader import stacked_experts
from muser.model.spec_gguf import spec_from_gguf
from muser.model.weights import LayerWeights, MoeWeights, Weights, aligned, missing

# GGUF per-layer suffix -> LayerWeights field
_LAYER = {
    "attn_norm.weight": "attn_norm",
    "attn_q.weight": "wq", "attn_k.weight": "wk", "attn_v.weight": "wv", "attn_output.weight": "wo",
    "attn_q.bias": "bq", "attn_k.bias": "bk", "attn_v.bias": "bv", "attn_output.bias": "bo",
    "attn_q_norm.weight": "q_norm", "attn_k_norm.weight": "k_norm",
    "post_attention_norm.weight": "post_attn_norm",
    "ffn_norm.weight": "pre_ffn_norm",
    "post_ffw_norm.weight": "post_ffn_norm",
    "ffn_gate.weight": "w_gate", "ffn_up.weight": "w_up", "ffn_down.weight": "w_down",
    # Gemma 4: the layer's output scale and its per-layer input (gate, projection, norm)
    "layer_output_scale.weight": "layer_scale",
    "inp_gate.weight": "ple_gate", "proj.weight": "ple_proj", "post_norm.weight": "ple_norm",
}
# Gemma 4's per-layer input embeddings, beside token_embd
_TOP_PLE = {"per_layer_token_embd.weight": "per_layer_embed", "per_layer_model_proj.weight": "per_layer_proj",
            "per_layer_proj_norm.weight": "per_layer_norm"}
# gpt-oss (llama.cpp's names): sinks, the router and the experts, stacked [E, out, in]
_MOE = {"ffn_gate_inp.weight": "router", "ffn_gate_inp.bias": "router_bias",
        "ffn_gate_exps.weight": "w_gate", "ffn_gate_exps.bias": "b_gate",
        "ffn_up_exps.weight": "w_up", "ffn_up_exps.bias": "b_up",
        "ffn_down_exps.weight": "w_down", "ffn_down_exps.bias": "b_down"}
# Gemma 4's experts (llama.cpp's names): fused gate/up [E, 2I, hidden], down [E, hidden, I], the
# router and its two scales, and the norms around the expert branch -- the safetensors keys'
# roles, so one conversion (safetensors_loader.stacked_experts) builds the MoeWeights
_GEMMA4_MOE = {"ffn_gate_up_exps.weight": "gate_up", "ffn_down_exps.weight": "down",
               "ffn_gate_inp.weight": "router", "ffn_gate_inp.scale": "router_scale",
               "ffn_down_exps.scale": "expert_scale", "post_ffw_norm_1.weight": "post_dense_norm",
               "pre_ffw_norm_2.weight": "pre_moe_norm", "post_ffw_norm_2.weight": "post_moe_norm"}
_IGNORED = {"rope_freqs.weight"}       # llama3 rope factors: refused by the spec before we get here
_PERMUTED_ARCHS = {"llama"}


def _open(reader_or_path):
    return GGUFFile(reader_or_path) if isinstance(reader_or_path, (str, Path)) else reader_or_path


def _unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo convert_hf_to_gguf's `permute` of q/k rows: per head, rows were reordered
    from [half0 | half1] to interleaved pairs; put them back for half-rotation RoPE."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def load_gguf(path, dtype: torch.dtype = torch.float32, progress: bool = True,
              max_context: int | None = None) -> tuple[ModelSpec, Weights, GGUFFile]:
    """(spec, weights on CPU in `dtype` (norms float32), the open `GGUFFile`)."""
    r = _open(path)
    spec = spec_from_gguf(r, max_context=max_context)
    arch = spec.architecture
    _prefetch(r)
    top: dict[str, torch.Tensor] = {}
    per_layer: list[dict[str, torch.Tensor]] = [{} for _ in range(spec.num_layers)]
    moe_raw: dict[int, dict[str, torch.Tensor]] = {}
    it = r.tensors
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(it, desc=f"loading {Path(getattr(r, 'path', path)).name}", unit="tensor", leave=False)
    for t in it:
        name = t.name
        if name in _IGNORED:
            continue
        suffix = name.split(".", 2)[-1] if name.startswith("blk.") else None
        field = _LAYER.get(suffix)
        if arch == "gpt_oss":
            if suffix == "post_attention_norm.weight":      # gpt-oss: the norm before the experts
                field = "pre_ffn_norm"
            elif suffix in ("attn_sinks.weight", "attn_sinks"):
                field = "sinks"
            elif suffix in _MOE:
                # MXFP4 and every other block type: dequantized (unknown types by gguf's own code)
                w = dequantize(t.data, t.tensor_type, torch.float32)
                moe_raw.setdefault(int(name.split(".", 2)[1]), {})[_MOE[suffix]] = w
                continue
        elif arch == "gemma4" and suffix in _GEMMA4_MOE:
            w = dequantize(t.data, t.tensor_type, torch.float32)
            moe_raw.setdefault(int(name.split(".", 2)[1]), {})[_GEMMA4_MOE[suffix]] = w
            continue
        # norms are kept float32 whatever the matrices' dtype (the norms run in float32)
        is_norm = (field or "").endswith("norm") or name in ("output_norm.weight",
                                                              "per_layer_proj_norm.weight")
        # a float tensor comes back as a view of the memory map: give it aligned storage
        w = aligned(dequantize(t.data, t.tensor_type, torch.float32 if is_norm else dtype))
        if name.startswith("blk."):
            idx = name.split(".", 2)[1]
            if field is None:
                raise ModelFormatError(f"GGUF tensor {name!r} has no place in muser's weights")
            if arch in _PERMUTED_ARCHS and field in ("wq", "bq"):
                w = _unpermute(w, spec.num_heads)
            elif arch in _PERMUTED_ARCHS and field in ("wk", "bk"):
                w = _unpermute(w, spec.num_kv_heads)
            per_layer[int(idx)][field] = w
        elif name in ("token_embd.weight", "output_norm.weight", "output.weight") or name in _TOP_PLE:
            top[name] = w
        else:
            raise ModelFormatError(f"GGUF tensor {name!r} has no place in muser's weights")
    for i, raw in moe_raw.items():
        per_layer[i]["moe"] = (stacked_experts(raw, spec, dtype, i) if arch == "gemma4"
                               else _experts(raw, spec, dtype, i))
    try:
        layers = [LayerWeights(**d) for d in per_layer]
    except TypeError as e:
        raise ModelFormatError(f"GGUF is missing layer tensors: {e}") from None
    for i, (lw, ls) in enumerate(zip(layers, spec.layers)):
        gaps = missing(lw, spec, ls)
        if gaps:
            raise ModelFormatError(f"GGUF layer {i} lacks {', '.join(gaps)}")
    if spec.per_layer_input and any(k not in top for k in _TOP_PLE):
        raise ModelFormatError("Gemma 4 GGUF lacks its per-layer input embeddings "
                               f"({', '.join(sorted(set(_TOP_PLE) - set(top)))})")
    weights = Weights(embed=top["token_embd.weight"], final_norm=top["output_norm.weight"],
                      layers=layers, lm_head=top.get("output.weight"),
                      **{f: top.get(k) for k, f in _TOP_PLE.items()})
    return spec, weights.to(None, dtype), r


def _experts(raw: dict, spec, dtype, layer: int) -> MoeWeights:
    """gpt-oss experts as llama.cpp stores them: gate / up / down split (no interleaving),
    [E, out, in] (ggml ne0 = in), biases [E, out], the router [E, hidden] + bias [E]."""
    need = set(_MOE.values())
    if need - set(raw):
        raise ModelFormatError(f"GGUF layer {layer}: experts lack {', '.join(sorted(need - set(raw)))}")
    E = spec.moe.num_experts
    if raw["w_gate"].shape[0] != E:
        raise ModelFormatError(f"GGUF layer {layer}: expected {E} experts, got {raw['w_gate'].shape[0]}")
    split = {k: [raw[k][e].to(dtype).contiguous() for e in range(E)] for k in ("w_gate", "w_up", "w_down")}
    return MoeWeights(router=raw["router"].to(dtype), router_bias=raw["router_bias"].to(dtype),
                      b_gate=raw["b_gate"].to(dtype), b_up=raw["b_up"].to(dtype), b_down=raw["b_down"].to(dtype),
                      **split)


def _prefetch(r) -> None:
    """Read the file once, sequentially, before touching the memory map: on these VMs a
    cold mmap faults page by page (~5 s for 250 MB) where one buffered read takes ~0.2 s."""
    path = getattr(r, "path", None)
    if path is None:
        return
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(1 << 24)
        while f.readinto(buf):
            pass


def raw_q8_0(reader_or_path, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A Q8_0 tensor's blocks without dequantizing: (qs int8 [rows, cols],
    scales float32 [rows, cols // 32]); value[r, c] = qs[r, c] * scales[r, c // 32].
    Works on a `GGUFFile` or a `gguf.GGUFReader`."""
    r = _open(reader_or_path)
    t = next((x for x in r.tensors if x.name == name), None)
    if t is None:
        raise ModelFormatError(f"GGUF has no tensor named {name!r}")
    if int(t.tensor_type) != int(GGMLQuantizationType.Q8_0):
        raise ModelFormatError(f"tensor {name!r} is {GGMLQuantizationType(int(t.tensor_type)).name}, not Q8_0")
    data = np.asarray(t.data)
    return q8_0_blocks(data.reshape(-1, data.shape[-1]))
