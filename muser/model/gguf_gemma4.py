"""Gemma 4 from GGUF: the header as llama.cpp's converter writes it, read back as a config.

Owns: `gemma4_config(reader, meta, tensor_names, common)` -> the transformers-style config dict
that `spec._gemma4` reads (called from `spec_gguf.spec_from_gguf`), so a GGUF and a safetensors
checkpoint of one model build the same `ModelSpec`.  Does not own: the layer map itself (spec.py)
or the tensors (gguf_loader.py).

What llama.cpp's `Gemma4Model` (conversion/gemma.py) writes, and how it maps back:
    gemma4.attention.sliding_window_pattern   one bool per layer, true = sliding   -> layer_types
    gemma4.attention.key_length / _swa        head dim of full / sliding layers     -> global_head_dim, head_dim
    gemma4.attention.head_count_kv            an int, or one per layer              -> per_layer_config
    gemma4.attention.shared_kv_layers         the last N layers read earlier planes -> num_kv_shared_layers
    gemma4.embedding_length_per_layer_input   per-layer input width (0: none)       -> hidden_size_per_layer_input
    gemma4.rope.freq_base / freq_base_swa     RoPE theta of full / sliding layers
    rope_freqs (tensor, full layers only)     [head_dim/2]: 1.0 for rotated pairs, 1e30 for the
                                              rest -- "proportional" RoPE's partial_rotary_factor
    no attn_v on a full layer                 V = K there                           -> attention_k_eq_v
    gemma4.feed_forward_length                an int, or one per layer (double-wide MLP of the
                                              KV-shared layers: the weights carry the width)
    gemma4.expert_count / _used_count         experts beside the MLP (26B-A4B): ffn_gate_up_exps
    gemma4.expert_feed_forward_length         [E, 2I, hidden], ffn_down_exps [E, hidden, I], the router
                                              ffn_gate_inp (+ .scale), per-expert scales ffn_down_exps.scale
Norms are stored as Gemma 4 uses them (no +1, unlike Gemma 3).
"""
from __future__ import annotations

import numpy as np

from ..errors import ModelFormatError

SLIDING, FULL = "sliding_attention", "full_attention"


def _per_layer(value, n: int, what: str) -> list[int]:
    if value is None:
        raise ModelFormatError(f"Gemma 4 GGUF lacks {what}")
    if isinstance(value, (list, tuple, np.ndarray)):
        out = [int(v) for v in value]
        if len(out) != n:
            raise ModelFormatError(f"Gemma 4 GGUF {what}: expected {n} values, got {len(out)}")
        return out
    return [int(value)] * n


def _partial_factor(reader, head_dim: int) -> float:
    """The rotated fraction of a full layer's head dim, from the `rope_freqs` factors."""
    t = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    if t is None:
        return 1.0
    f = np.asarray(t.data, dtype=np.float64).reshape(-1)
    if f.size != head_dim // 2:
        raise ModelFormatError(f"Gemma 4 GGUF rope_freqs: expected {head_dim // 2} factors, got {f.size}")
    rotated = int((f < 1e20).sum())
    if not (np.all(f[:rotated] == 1.0) and np.all(f[rotated:] >= 1e20)):
        raise ModelFormatError("Gemma 4 GGUF rope_freqs: expected 1.0 for the rotated pairs, then 1e30")
    return 2.0 * rotated / head_dim


def gemma4_config(reader, meta, names: set, common: dict) -> dict:
    """`meta(key, default)` reads `gemma4.<key>`; `common`: what spec_from_gguf already read."""
    n = int(meta("block_count"))
    experts = int(meta("expert_count", 0) or 0)
    pattern = meta("attention.sliding_window_pattern")
    if pattern is None or isinstance(pattern, (int, float)):
        raise ModelFormatError("Gemma 4 GGUF lacks attention.sliding_window_pattern (one flag per layer)")
    types = [SLIDING if bool(x) else FULL for x in pattern]
    if len(types) != n:
        raise ModelFormatError(f"Gemma 4 GGUF sliding_window_pattern: expected {n} flags, got {len(types)}")
    head_full = int(meta("attention.key_length"))
    head_swa = int(meta("attention.key_length_swa", head_full))
    kv = _per_layer(meta("attention.head_count_kv"), n, "attention.head_count_kv")
    # one width per layer when the KV-shared layers' MLP is double-wide: the weights carry it
    ffn = _per_layer(meta("feed_forward_length"), n, "feed_forward_length")
    shared = int(meta("attention.shared_kv_layers", 0) or 0)
    computing = range(n - shared)
    k_eq_v = any(types[i] == FULL and f"blk.{i}.attn_v.weight" not in names for i in computing)
    swa_rot = int(meta("rope.dimension_count_swa", head_swa))
    sliding_rope = {"rope_type": "default", "rope_theta": float(meta("rope.freq_base_swa", 10_000.0))}
    if swa_rot != head_swa:
        sliding_rope["partial_rotary_factor"] = swa_rot / head_swa
    full_rope = {"rope_type": "proportional", "rope_theta": float(meta("rope.freq_base", 1_000_000.0)),
                 "partial_rotary_factor": _partial_factor(reader, head_full)}
    first_sliding = next((i for i, t in enumerate(types) if t == SLIDING), 0)
    return {
        "vocab_size": common["vocab_size"], "intermediate_size": ffn[0],
        "rms_norm_eps": common["norm_eps"], "bos_token_id": common["bos_token_id"],
        "eos_token_id": list(common["eos_token_ids"]) or 1,
        "tie_word_embeddings": common["tie_embeddings"],
        "hidden_activation": "gelu_pytorch_tanh",
        "head_dim": head_swa, "num_key_value_heads": kv[first_sliding],
        "layer_types": types, "sliding_window": meta("attention.sliding_window"),
        "per_layer_config": {str(i): {"head_dim": head_full if t == FULL else head_swa,
                                      "num_key_value_heads": kv[i]} for i, t in enumerate(types)},
        "attention_k_eq_v": k_eq_v, "num_kv_shared_layers": shared,
        "hidden_size_per_layer_input": int(meta("embedding_length_per_layer_input", 0) or 0),
        "final_logit_softcapping": meta("final_logit_softcapping"),
        "rope_parameters": {SLIDING: sliding_rope, FULL: full_rope},
        "attention_bias": "blk.0.attn_q.bias" in names,
        "enable_moe_block": experts > 0, "num_experts": experts or None,
        "top_k_experts": meta("expert_used_count"), "moe_intermediate_size": meta("expert_feed_forward_length"),
    }
