"""The weights container: explicit named tensors, no modules.

Owns: `Weights` / `LayerWeights` (what tensors a model has, their shapes and
meaning), moving them between devices / dtypes, and counting their bytes.
Does not own: reading files (`gguf_loader`, `safetensors_loader`) or maths
(`transformer`).

Conventions:
  * matrices are [out_features, in_features] (what `F.linear` takes);
  * norm weights are *effective*: the multiplier actually applied.  HF Gemma
    stores w and applies (1 + w): the loader folds the +1 in.  Gemma GGUFs
    already store 1 + w.  Norm weights stay float32 under `.to(dtype)`,
    because the norms are computed in float32.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import torch

# fields that are norm multipliers (kept float32 by .to())
_NORMS = {"attn_norm", "q_norm", "k_norm", "post_attn_norm", "pre_ffn_norm", "post_ffn_norm", "final_norm",
          "ple_norm", "per_layer_norm", "post_dense_norm", "pre_moe_norm", "post_moe_norm", "router_norm"}


@dataclass
class MoeWeights:
    """One layer's experts and router (maths: model/moe.py).  Experts are lists indexed by
    expert, each matrix [out, in] like every other projection (or a FastLinear)."""

    router: object                                # [E, hidden]
    w_gate: list                                  # E x [I, hidden]
    w_up: list                                    # E x [I, hidden]
    w_down: list                                  # E x [hidden, I]
    router_bias: torch.Tensor | None = None       # [E]          (gpt-oss)
    b_gate: torch.Tensor | None = None            # [E, I]       (gpt-oss)
    b_up: torch.Tensor | None = None              # [E, I]
    b_down: torch.Tensor | None = None            # [E, hidden]
    expert_scale: torch.Tensor | None = None      # [E]          (Gemma 4 per-expert scale)
    router_norm: torch.Tensor | None = None       # [hidden]     (Gemma 4: scale * hidden^-0.5, effective)
    post_dense_norm: torch.Tensor | None = None   # [hidden]     (Gemma 4: after the dense MLP)
    pre_moe_norm: torch.Tensor | None = None      # [hidden]     (Gemma 4: before the experts)
    post_moe_norm: torch.Tensor | None = None     # [hidden]     (Gemma 4: after the experts)
    w_gate_up: list | None = None                 # E x fused [2I, hidden] (quantized path)

    def to(self, device=None, dtype=None) -> "MoeWeights":
        def c(name, t):
            if t is None:
                return None
            if isinstance(t, list):
                return [_cast(name, x, device, dtype) for x in t]
            return _cast(name, t, device, dtype)
        return replace(self, **{f.name: c(f.name, getattr(self, f.name)) for f in fields(self)})

    def tensors(self):
        out = []
        for f in fields(self):
            t = getattr(self, f.name)
            out.extend(t if isinstance(t, list) else [] if t is None else [t])
        return out


@dataclass
class LayerWeights:
    wq: torch.Tensor                              # [H*D, hidden]
    wo: torch.Tensor                              # [hidden, H*D]
    attn_norm: torch.Tensor | None = None         # [hidden]  (None: post-norm-only families)
    wk: torch.Tensor | None = None                # [KV*D, hidden]  (None: a KV-shared layer)
    wv: torch.Tensor | None = None                # [KV*D, hidden]  (None: shared, or V = K)
    w_gate: torch.Tensor | None = None            # [I, hidden]     (None: experts only)
    w_up: torch.Tensor | None = None              # [I, hidden]
    w_down: torch.Tensor | None = None            # [hidden, I]
    bq: torch.Tensor | None = None                # [H*D]   (Qwen2, gpt-oss)
    bk: torch.Tensor | None = None                # [KV*D]
    bv: torch.Tensor | None = None                # [KV*D]
    bo: torch.Tensor | None = None                # [hidden]
    q_norm: torch.Tensor | None = None            # [D] per head, or [H*D] (qk_norm_span "all")
    k_norm: torch.Tensor | None = None            # [D] or [KV*D]
    post_attn_norm: torch.Tensor | None = None    # [hidden] (Gemma sandwich; OLMo 3 / EXAONE 4 post-norm)
    pre_ffn_norm: torch.Tensor | None = None      # [hidden] (Llama's post_attention_layernorm, Gemma's pre_feedforward)
    post_ffn_norm: torch.Tensor | None = None     # [hidden] (Gemma sandwich; post-norm families)
    sinks: torch.Tensor | None = None             # [H] float32 (gpt-oss attention sinks)
    moe: MoeWeights | None = None                 # experts (gpt-oss: instead of the MLP; Gemma 4: beside it)
    ple_gate: torch.Tensor | None = None          # [P, hidden] (Gemma 4 per-layer input gate)
    ple_proj: torch.Tensor | None = None          # [hidden, P]
    ple_norm: torch.Tensor | None = None          # [hidden]
    layer_scale: torch.Tensor | None = None       # [1] (Gemma 4 layer_scalar, multiplies the layer's output)
    # Fused projections (the CPU fast path, model/quantize.py): when set, the
    # transformer runs one matmul instead of three (q|k|v) or two (gate|up).
    wqkv: object | None = None                    # [(H + 2 KV) * D, hidden] (q|k only when V = K; q alone when shared)
    w_gate_up: object | None = None               # [2 I, hidden]

    def to(self, device=None, dtype: torch.dtype | None = None) -> "LayerWeights":
        if self.wqkv is not None or self.w_gate_up is not None:
            raise ValueError("fused (quantized) layer weights are built in place; they do not move")
        return replace(self, **{f.name: (getattr(self, f.name).to(device, dtype) if f.name == "moe" and self.moe
                                         else _cast(f.name, getattr(self, f.name), device, dtype))
                                for f in fields(self)})

    def tensors(self):
        out = [t for f in fields(self) if f.name != "moe" and (t := getattr(self, f.name)) is not None]
        return out + (self.moe.tensors() if self.moe is not None else [])


@dataclass
class Weights:
    embed: torch.Tensor                           # [vocab, hidden] (or rows read from the head's
                                                  # exact blocks: cuda/weights_int8.EmbedBlocks)
    final_norm: torch.Tensor                      # [hidden]
    layers: list[LayerWeights] = field(default_factory=list)
    lm_head: torch.Tensor | None = None           # [vocab, hidden]; None when tied to embed
    # Gemma 4 per-layer input embeddings (PLE): token table and the projection of the main embedding
    per_layer_embed: torch.Tensor | None = None   # [vocab_ple, L * P]
    per_layer_proj: object | None = None          # [L * P, hidden]
    per_layer_norm: torch.Tensor | None = None    # [P]

    @property
    def output(self) -> torch.Tensor:
        """The LM-head matrix actually used: its own or the tied embedding."""
        return self.embed if self.lm_head is None else self.lm_head

    def to(self, device=None, dtype: torch.dtype | None = None) -> "Weights":
        """A copy on `device` with matrices in `dtype`; norms stay float32.
        Tensors already there are shared, not copied."""
        return Weights(
            embed=_cast("embed", self.embed, device, dtype),
            final_norm=_cast("final_norm", self.final_norm, device, dtype),
            layers=[lw.to(device, dtype) for lw in self.layers],
            lm_head=_cast("lm_head", self.lm_head, device, dtype),
            per_layer_embed=_cast("per_layer_embed", self.per_layer_embed, device, dtype),
            per_layer_proj=_cast("per_layer_proj", self.per_layer_proj, device, dtype),
            per_layer_norm=_cast("per_layer_norm", self.per_layer_norm, device, dtype),
        )

    def tensors(self):
        out = [self.embed, self.final_norm] + ([self.lm_head] if self.lm_head is not None else [])
        out += [t for t in (self.per_layer_embed, self.per_layer_proj, self.per_layer_norm) if t is not None]
        for lw in self.layers:
            out.extend(lw.tensors())
        return out

    def nbytes(self) -> int:
        """Bytes held (each storage counted once)."""
        seen, total = set(), 0
        for t in self.tensors():
            if not isinstance(t, torch.Tensor):           # a quant.QuantizedLinear
                total += t.nbytes()
                continue
            key = (t.data_ptr(), t.numel(), t.device)     # views of one fused storage count once each
            if key not in seen:
                seen.add(key)
                total += t.numel() * t.element_size()
        return total

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.device


def _cast(name: str, t: torch.Tensor | None, device, dtype):
    if t is None:
        return None
    if name == "sinks":                       # softmax logits: kept float32 like the norms
        return t.to(device=device if device is not None else t.device, dtype=torch.float32)
    want = torch.float32 if name in _NORMS else (dtype or t.dtype)
    return t.to(device=device if device is not None else t.device, dtype=want)


def missing(lw: LayerWeights, spec, ls) -> list[str]:
    """The tensors layer `ls` of `spec` needs that `lw` lacks (the loaders' completeness gate)."""
    need = ["wq", "wo"]
    if spec.pre_norm:
        need.append("attn_norm")
    if ls.owns_plane:
        need += ["wk"] + ([] if ls.k_eq_v else ["wv"])
        if spec.qk_norm:
            need.append("k_norm")
    if spec.qk_norm:
        need.append("q_norm")
    if spec.sandwich_norm or not spec.pre_norm:
        need += ["post_attn_norm", "post_ffn_norm"]
    if spec.pre_norm and not spec.parallel_block:
        need.append("pre_ffn_norm")
    if spec.moe is None or spec.moe.style == "gemma4":
        need += ["w_gate", "w_up", "w_down"]
    if spec.moe is not None:
        need.append("moe")
    if spec.attention_sinks:
        need.append("sinks")
    if spec.per_layer_input:
        need += ["ple_gate", "ple_proj", "ple_norm"]
    return [n for n in need if getattr(lw, n) is None and not (n in ("wq", "wk", "wv") and lw.wqkv is not None)
            and not (n in ("w_gate", "w_up") and lw.w_gate_up is not None)]


ALIGN = 64                                  # bytes: the CPU allocator's alignment


def aligned(t: torch.Tensor) -> torch.Tensor:
    """`t` in storage of its own that starts on an ALIGN boundary.  A tensor read from a file
    can start anywhere (8 bytes past a 64-byte line was seen in a safetensors file), and MKL's
    float32 GEMM rounds by alignment: the same bits loaded from GGUF (aligned) and safetensors
    gave logits 6e-8 apart.  Aligned, a weight's arithmetic depends on its bits alone."""
    return t.clone() if t.data_ptr() % ALIGN else t
