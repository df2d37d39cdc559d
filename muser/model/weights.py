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
_NORMS = {"attn_norm", "q_norm", "k_norm", "post_attn_norm", "pre_ffn_norm", "post_ffn_norm", "final_norm"}


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor                       # [hidden]
    wq: torch.Tensor                              # [H*D, hidden]
    wk: torch.Tensor                              # [KV*D, hidden]
    wv: torch.Tensor                              # [KV*D, hidden]
    wo: torch.Tensor                              # [hidden, H*D]
    w_gate: torch.Tensor                          # [I, hidden]
    w_up: torch.Tensor                            # [I, hidden]
    w_down: torch.Tensor                          # [hidden, I]
    bq: torch.Tensor | None = None                # [H*D]   (Qwen2)
    bk: torch.Tensor | None = None                # [KV*D]
    bv: torch.Tensor | None = None                # [KV*D]
    bo: torch.Tensor | None = None                # [hidden]
    q_norm: torch.Tensor | None = None            # [D]     (Gemma 3 qk-norm)
    k_norm: torch.Tensor | None = None            # [D]
    post_attn_norm: torch.Tensor | None = None    # [hidden] (Gemma sandwich)
    pre_ffn_norm: torch.Tensor | None = None      # [hidden] (Llama's post_attention_layernorm, Gemma's pre_feedforward)
    post_ffn_norm: torch.Tensor | None = None     # [hidden] (Gemma sandwich)
    # Fused projections (the CPU fast path, model/quantize.py): when set, the
    # transformer runs one matmul instead of three (q|k|v) or two (gate|up).
    wqkv: object | None = None                    # [(H + 2 KV) * D, hidden]
    w_gate_up: object | None = None               # [2 I, hidden]

    def to(self, device=None, dtype: torch.dtype | None = None) -> "LayerWeights":
        if self.wqkv is not None or self.w_gate_up is not None:
            raise ValueError("fused (quantized) layer weights are built in place; they do not move")
        return replace(self, **{f.name: _cast(f.name, getattr(self, f.name), device, dtype) for f in fields(self)})

    def tensors(self):
        return [t for f in fields(self) if (t := getattr(self, f.name)) is not None]


@dataclass
class Weights:
    embed: torch.Tensor                           # [vocab, hidden]
    final_norm: torch.Tensor                      # [hidden]
    layers: list[LayerWeights] = field(default_factory=list)
    lm_head: torch.Tensor | None = None           # [vocab, hidden]; None when tied to embed

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
        )

    def tensors(self):
        out = [self.embed, self.final_norm] + ([self.lm_head] if self.lm_head is not None else [])
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
    want = torch.float32 if name in _NORMS else (dtype or t.dtype)
    return t.to(device=device if device is not None else t.device, dtype=want)
