"""The layer map: a checkpoint's config turned into a frozen `ModelSpec`.

Owns: every decision about a layer's kind (sliding or full), its window, its
RoPE (base, linear scale, YaRN / llama3 / proportional schedule, or none), its
head dim and kv heads, whether it reads another layer's plane (KV sharing), and
the architecture knobs the transformer reads (norm style and placement, qk-norm
span, sinks, experts, per-layer inputs, soft-caps, scales), for Gemma 3 / 4,
gpt-oss, OLMo 3, EXAONE 4, Cohere2 and Llama / Qwen2 / Mistral / Ministral.  This is the ONLY place those are
decided; loaders and the transformer read the spec and never re-derive them.
Does not own: the per-layer rules every family reads through -- layer types and
their pattern, a type's RoPE from the config's rope keys, building the
`LayerSpec`s (moved to `spec_layers.py`: `_FULL`, `_SLIDING`, `_layer_types`,
`_rope_params`, `_layers`); tensors (`weights`, loaders) or the maths
(`transformer`, `ops`).

Sources: a HF `config.json` dict (`spec_from_hf_config`, here) or a GGUF header
(`spec_gguf.spec_from_gguf`, which reads its header into the same helpers and
conventions: the spec's decisions stay in spec.py, spec_layers.py and spec_gguf.py).
"""
from __future__ import annotations

import math

from muser.config import ModelSpec, MoeSpec, RopeScaling
from muser.errors import ModelFormatError
from muser.model.spec_layers import _FULL, _SLIDING, _layer_types, _layers, _rope_params

# Gemma 3's conventions (its config class defaults), used where a source is silent.
GEMMA3_SLIDING_PATTERN = 6          # every 6th layer (5, 11, 17, ...) is full attention
GEMMA3_LOCAL_BASE = 10_000.0
GEMMA3_GLOBAL_BASE = 1_000_000.0
GEMMA3_END_OF_TURN = 106            # <end_of_turn>: an instruction-tuned Gemma ends its turn with it
COHERE2_SLIDING_PATTERN = 4


def _eos(value) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(int(v) for v in (value if isinstance(value, (list, tuple)) else [value]))


def spec_from_hf_config(cfg: dict, max_context: int | None = None) -> ModelSpec:
    """A `ModelSpec` from a HF `config.json` dict (Gemma 3, Cohere2, Llama/Qwen2/Mistral)."""
    mtype = cfg.get("model_type", "")
    top = cfg
    if mtype in ("gemma3", "gemma4") and "text_config" in cfg:      # multimodal wrapper: the text tower
        mtype = mtype + "_text"
        cfg = dict(cfg["text_config"] or {}, model_type=mtype)
    n = cfg.get("num_hidden_layers")
    if not n:
        raise ModelFormatError(f"config of type {mtype!r} has no num_hidden_layers")
    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    kv = int(cfg.get("num_key_value_heads") or heads)
    ctx = int(max_context or cfg.get("max_position_embeddings") or 8192)

    if mtype in ("gemma3_text", "gemma3"):
        head_dim = int(cfg.get("head_dim") or 256)
        types = cfg.get("layer_types") or _layer_types(n, int(cfg.get("sliding_window_pattern", GEMMA3_SLIDING_PATTERN)))
        thetas = {_SLIDING: _rope_params(cfg, _SLIDING, GEMMA3_LOCAL_BASE),
                  _FULL: _rope_params(cfg, _FULL, GEMMA3_GLOBAL_BASE)}
        if cfg.get("use_bidirectional_attention"):
            raise ModelFormatError("Gemma 3 with bidirectional attention is not a causal LM")
        act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
        if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
            raise ModelFormatError(f"Gemma 3 activation {act!r} is not supported")
        eos = _eos(cfg.get("eos_token_id", top.get("eos_token_id", 1)))
        return ModelSpec(
            architecture="gemma3", vocab_size=int(cfg.get("vocab_size", 262_208)), hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]), num_heads=heads, num_kv_heads=kv,
            head_dim=head_dim, max_context=ctx, norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            layers=_layers(types, cfg.get("sliding_window", 4096), thetas),
            tie_embeddings=bool(top.get("tie_word_embeddings", cfg.get("tie_word_embeddings", True))),
            bos_token_id=cfg.get("bos_token_id", 2), eos_token_ids=eos,
            embed_scale=math.sqrt(hidden),
            query_scale=float(cfg.get("query_pre_attn_scalar", 256)) ** -0.5,
            final_logit_softcap=cfg.get("final_logit_softcapping"),
            # Gemma 3 replaced attention soft-capping with qk-norm: transformers (and llama.cpp)
            # ignore `attn_logit_softcapping` for it even when a config sets it, and so do we.
            attn_logit_softcap=None,
            activation="gelu_tanh", norm="rms", qk_norm=True, sandwich_norm=True,
            attention_bias=bool(cfg.get("attention_bias", False)),
        )

    if mtype == "cohere2":
        types = cfg.get("layer_types") or _layer_types(n, int(cfg.get("sliding_window_pattern", COHERE2_SLIDING_PATTERN)))
        theta, scale, _ = _rope_params(cfg, _SLIDING, 10_000.0)
        return ModelSpec(
            architecture="cohere2", vocab_size=int(cfg["vocab_size"]), hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]), num_heads=heads, num_kv_heads=kv,
            head_dim=hidden // heads,          # Cohere2's config forces this
            max_context=ctx, norm_eps=float(cfg.get("layer_norm_eps", 1e-5)),
            # full layers are NoPE: no rotation at all
            layers=_layers(types, cfg.get("sliding_window"), {_SLIDING: (theta, scale), _FULL: (theta, scale)},
                           rope_full=False),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            bos_token_id=cfg.get("bos_token_id"), eos_token_ids=_eos(cfg.get("eos_token_id")),
            logit_scale=float(cfg.get("logit_scale", 0.0625)),
            activation=_act(cfg.get("hidden_act", "silu")), norm="layernorm",
            parallel_block=True, rope_interleaved=True,
            attention_bias=bool(cfg.get("attention_bias", False)),
        )

    family = _FAMILIES.get(mtype)
    if family is not None:
        return family(cfg, top, n, hidden, heads, kv, ctx)

    if mtype in ("llama", "qwen2", "mistral", "ministral"):
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        window = cfg.get("sliding_window")
        types = cfg.get("layer_types")
        if not types:
            if mtype in ("mistral", "ministral") and window:
                types = [_SLIDING] * n
            elif mtype == "qwen2" and cfg.get("use_sliding_window") and window:
                mwl = int(cfg.get("max_window_layers", n))
                types = [_SLIDING if i >= mwl else _FULL for i in range(n)]
            else:
                types = [_FULL] * n
        rope = _rope_params(cfg, _FULL, 10_000.0, legacy_kinds=(_FULL, _SLIDING))
        return ModelSpec(
            architecture=mtype, vocab_size=int(cfg["vocab_size"]), hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]), num_heads=heads, num_kv_heads=kv,
            head_dim=head_dim, max_context=ctx, norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            layers=_layers(types, window, {_SLIDING: rope, _FULL: rope}),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            bos_token_id=cfg.get("bos_token_id"), eos_token_ids=_eos(cfg.get("eos_token_id")),
            activation=_act(cfg.get("hidden_act", "silu")),
            # Qwen2 always has q/k/v biases, whatever the config says
            attention_bias=mtype == "qwen2" or bool(cfg.get("attention_bias", False)),
        )
    raise ModelFormatError(f"unsupported model_type {mtype!r} (gemma3, gemma4, gpt_oss, olmo3, exaone4, "
                           "cohere2, llama, qwen2, mistral, ministral)")


# ----------------------------------------------------------------------------- 2025-26 hybrid families
def _common(cfg: dict, mtype: str, hidden: int, heads: int, kv: int, ctx: int, head_dim: int,
            tie_default: bool) -> dict:
    return dict(architecture=mtype, vocab_size=int(cfg["vocab_size"]), hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]), num_heads=heads, num_kv_heads=kv,
                head_dim=head_dim, max_context=ctx, norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                tie_embeddings=bool(cfg.get("tie_word_embeddings", tie_default)),
                bos_token_id=cfg.get("bos_token_id"), eos_token_ids=_eos(cfg.get("eos_token_id")))


def _gpt_oss(cfg, top, n, hidden, heads, kv, ctx) -> ModelSpec:
    """gpt-oss: 1:1 sliding (128) / full, sinks on every layer, YaRN on every layer,
    q/k/v/o biases, top-k experts with the clamped SwiGLU instead of the MLP."""
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    types = cfg.get("layer_types") or [_SLIDING if (i + 1) % 2 else _FULL for i in range(n)]
    rope = {t: _rope_params(cfg, t, 150_000.0, legacy_kinds=(_FULL, _SLIDING)) for t in (_SLIDING, _FULL)}
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ModelFormatError(f"gpt-oss activation {act!r} is not supported (its experts are SwiGLU)")
    moe = MoeSpec("gpt_oss", int(cfg["num_local_experts"]), int(cfg["num_experts_per_tok"]),
                  int(cfg["intermediate_size"]), float(cfg.get("swiglu_alpha", 1.702)),
                  float(cfg.get("swiglu_limit", 7.0)))
    return ModelSpec(layers=_layers(types, cfg.get("sliding_window", 128), rope),
                     attention_bias=bool(cfg.get("attention_bias", True)), attention_sinks=True, moe=moe,
                     **_common(cfg, "gpt_oss", hidden, heads, kv, ctx, head_dim, tie_default=False))


def _olmo3(cfg, top, n, hidden, heads, kv, ctx) -> ModelSpec:
    """OLMo 3: 3:1 sliding / full, RoPE on every layer (an old `rope_scaling` -- YaRN in the
    long-context checkpoints -- on full layers only), no input norms: post-attention and
    post-feed-forward norms only, qk-norm over all heads at once (before the head split)."""
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    types = cfg.get("layer_types") or _layer_types(n, 4)
    rope = {t: _rope_params(cfg, t, 500_000.0) for t in (_SLIDING, _FULL)}
    return ModelSpec(layers=_layers(types, cfg.get("sliding_window", 4096), rope),
                     activation=_act(cfg.get("hidden_act", "silu")), pre_norm=False, qk_norm=True,
                     qk_norm_span="all", attention_bias=bool(cfg.get("attention_bias", False)),
                     **_common(cfg, "olmo3", hidden, heads, kv, ctx, head_dim, tie_default=False))


def _exaone4(cfg, top, n, hidden, heads, kv, ctx) -> ModelSpec:
    """EXAONE 4: 3:1 sliding / full ("LLLG"); with a window the full layers are NoPE
    (without one every layer is full and rotated); post-norms only, per-head qk-norm."""
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    window = cfg.get("sliding_window")
    types = cfg.get("layer_types")
    if not types:
        pattern = cfg.get("sliding_window_pattern", 4)
        if not window:
            types = [_FULL] * n
        elif isinstance(pattern, str):          # e.g. "LLLG": L local (sliding), G global
            if set(pattern) - {"L", "G"} or not pattern:
                raise ModelFormatError(f"EXAONE 4 sliding_window_pattern {pattern!r}: expected L/G letters")
            types = [_SLIDING if pattern[i % len(pattern)] == "L" else _FULL for i in range(n)]
        else:
            types = _layer_types(n, int(pattern))
    rope = _rope_params(cfg, _SLIDING, 10_000.0, legacy_kinds=(_FULL, _SLIDING))
    return ModelSpec(layers=_layers(types, window, {_SLIDING: rope, _FULL: rope}, rope_full=not window),
                     activation=_act(cfg.get("hidden_act", "silu")), pre_norm=False, qk_norm=True,
                     **_common(cfg, "exaone4", hidden, heads, kv, ctx, head_dim, tie_default=False))


def _gemma4(cfg, top, n, hidden, heads, kv, ctx) -> ModelSpec:
    """Gemma 4 (text): 5:1 sliding / full by default; global layers get their own head dim
    (512) and kv heads, proportional partial RoPE and (attention_k_eq_v) V = K; Gemma's
    sandwich norms (effective weights, no +1), qk-norm, an unscaled value norm, softmax
    scale 1; per-layer input embeddings; the last `num_kv_shared_layers` layers read the
    plane of the last earlier layer of their kind; optional experts beside the MLP."""
    if cfg.get("use_bidirectional_attention") == "all":
        raise ModelFormatError("Gemma 4 with bidirectional attention is not a causal LM")
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise ModelFormatError(f"Gemma 4 activation {act!r} is not supported")
    head_dim = int(cfg.get("head_dim") or 256)
    types = list(cfg.get("layer_types") or _layer_types(n, 6))
    types[-1] = _FULL                                   # transformers forces the last layer global
    rope = {_SLIDING: _rope_params(cfg, _SLIDING, 10_000.0), _FULL: _rope_params(cfg, _FULL, 1_000_000.0)}
    if not cfg.get("rope_parameters"):                  # transformers' defaults for Gemma 4
        rope = {_SLIDING: (10_000.0, 1.0, None), _FULL: (1_000_000.0, 1.0, RopeScaling("proportional", partial=0.25))}
    k_eq_v = bool(cfg.get("attention_k_eq_v", False))
    # transformers writes `per_layer_config` (possibly {} when no layer differs); without the key
    # (config.json as Google writes it) global layers get `global_head_dim`, 512 by default.
    per_layer = {int(k): v for k, v in (cfg.get("per_layer_config") or {}).items()}
    if "per_layer_config" not in cfg:
        over = {"head_dim": int(cfg.get("global_head_dim", 512))}
        if k_eq_v and cfg.get("num_global_key_value_heads"):
            over["num_key_value_heads"] = int(cfg["num_global_key_value_heads"])
        per_layer = {i: over for i, t in enumerate(types) if t == _FULL}
    geometry: dict[int, dict] = {}
    for i, t in enumerate(types):
        o = per_layer.get(i, {})
        geometry[i] = dict(head_dim=int(o.get("head_dim", head_dim)),
                           kv_heads=int(o.get("num_key_value_heads", kv)), k_eq_v=k_eq_v and t == _FULL)
    shared = int(cfg.get("num_kv_shared_layers", 0) or 0)
    first = n - shared
    if shared:
        if first <= 0:
            raise ModelFormatError(f"Gemma 4 num_kv_shared_layers {shared} leaves no layer computing K/V")
        for i in range(first, n):                       # the last earlier layer of the same type
            src = max((j for j in range(first) if types[j] == types[i]), default=None)
            if src is None:
                raise ModelFormatError(f"Gemma 4 layer {i} ({types[i]}) shares K/V but no earlier layer has its type")
            geometry[i] = dict(geometry[src], kv_source=src)
    moe = None
    if cfg.get("enable_moe_block"):
        moe = MoeSpec("gemma4", int(cfg["num_experts"]), int(cfg["top_k_experts"]),
                      int(cfg["moe_intermediate_size"]))
    common = _common(cfg, "gemma4", hidden, heads, kv, ctx, head_dim, tie_default=True)
    common["eos_token_ids"] = _eos(cfg.get("eos_token_id", top.get("eos_token_id", 1)))
    common["tie_embeddings"] = bool(top.get("tie_word_embeddings", cfg.get("tie_word_embeddings", True)))
    return ModelSpec(layers=_layers(types, cfg.get("sliding_window", 512), rope, geometry=geometry),
                     embed_scale=math.sqrt(hidden), query_scale=1.0,
                     final_logit_softcap=cfg.get("final_logit_softcapping"),
                     activation="gelu_tanh", qk_norm=True, sandwich_norm=True, v_norm=True, moe=moe,
                     per_layer_input=int(cfg.get("hidden_size_per_layer_input") or 0),
                     attention_bias=bool(cfg.get("attention_bias", False)), **common)


_FAMILIES = {"gpt_oss": _gpt_oss, "olmo3": _olmo3, "exaone4": _exaone4, "gemma4_text": _gemma4}


def _act(name: str) -> str:
    if name in ("silu", "swish"):
        return "silu"
    if name in ("gelu_pytorch_tanh", "gelu_tanh"):
        return "gelu_tanh"
    raise ModelFormatError(f"activation {name!r} is not supported")
