"""The per-layer rules of the layer map: layer types, a type's RoPE, and the LayerSpecs built from them.

Owns: the two layer types (`_FULL`, `_SLIDING`, HF's names) and HF's periodic
pattern of them (`_layer_types`); a layer type's RoPE read from a `config.json`
(`_rope_params`: transformers 5's `rope_parameters`, flat or keyed by layer
type, and the older `rope_theta` / `rope_local_base_freq` / `rope_scaling` keys
-> base, linear scale, or a YaRN / llama3 / proportional schedule); and turning
a list of layer types into the spec's `LayerSpec`s (`_layers`: window, RoPE or
NoPE, per-layer geometry overrides, the checks that a sliding layer has a
window).  Both sources use these: `spec.py` (config.json) and `spec_gguf.py`
(a GGUF header).
Does not own: which architecture gets which pattern, window, RoPE base or
geometry (`spec.py`, `spec_gguf.py`: each family's decisions and conventions),
the RoPE maths (`rope.py`, `ops.py`), or tensors.
"""
from __future__ import annotations

import math

from muser.config import LayerSpec, RopeScaling
from muser.errors import ModelFormatError

_FULL, _SLIDING = "full_attention", "sliding_attention"


def _layer_types(n: int, pattern: int) -> list[str]:
    """HF's rule: layer i is full iff (i + 1) % pattern == 0."""
    return [_FULL if (i + 1) % pattern == 0 else _SLIDING for i in range(n)]


def _rope_params(cfg: dict, kind: str, default_theta: float,
                 legacy_kinds: tuple[str, ...] = (_FULL,)) -> tuple[float, float, RopeScaling | None]:
    """(theta, linear scale, other schedule) for a layer type, reading transformers 5's
    `rope_parameters` (flat, or keyed by layer type) and the older `rope_theta` /
    `rope_scaling` keys (`legacy_kinds`: the layer types an old `rope_scaling` applies to --
    Gemma 3 and OLMo 3 scale their global layers only)."""
    rp = cfg.get("rope_parameters") or {}
    if kind in rp or _FULL in rp or _SLIDING in rp:      # keyed by layer type (Gemma 3)
        rp = rp.get(kind) or {}
    theta = rp.get("rope_theta")
    if theta is None:
        if kind == _SLIDING and cfg.get("rope_local_base_freq") is not None:
            theta = cfg["rope_local_base_freq"]
        else:
            theta = cfg.get("rope_theta", default_theta)
    scaling = dict(rp) if rp.get("rope_type", "default") != "default" else None
    if scaling is None and cfg.get("rope_scaling") and kind in legacy_kinds:
        scaling = cfg["rope_scaling"]
    if not scaling:
        if float(rp.get("partial_rotary_factor", 1.0)) != 1.0:
            raise ModelFormatError(f"partial rotary factor {rp['partial_rotary_factor']} without the "
                                   "proportional RoPE type is not supported")
        return float(theta), 1.0, None
    rtype = scaling.get("rope_type", scaling.get("type", "default"))
    if rtype == "default":
        return float(theta), 1.0, None
    if rtype == "linear":
        return float(theta), float(scaling["factor"]), None
    if rtype == "proportional":
        return float(theta), 1.0, RopeScaling("proportional", factor=float(scaling.get("factor", 1.0)),
                                              partial=float(scaling.get("partial_rotary_factor", 1.0)))
    if rtype == "llama3":
        return float(theta), 1.0, RopeScaling(
            "llama3", factor=float(scaling["factor"]), low_freq=float(scaling["low_freq_factor"]),
            high_freq=float(scaling["high_freq_factor"]),
            original_context=int(scaling["original_max_position_embeddings"]))
    if rtype == "yarn":
        orig = int(scaling["original_max_position_embeddings"])
        factor = scaling.get("factor") or cfg.get("max_position_embeddings", orig) / orig
        att = scaling.get("attention_factor")
        ms, msd = scaling.get("mscale"), scaling.get("mscale_all_dim")
        if att is None and ms and msd:
            def get(m):
                return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0
            att = get(ms) / get(msd)
        top = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        return float(theta), 1.0, RopeScaling(
            "yarn", factor=float(factor), beta_fast=float(scaling.get("beta_fast") or 32),
            beta_slow=float(scaling.get("beta_slow") or 1), original_context=orig,
            # transformers reads `truncate` from the top-level rope dict
            truncate=bool(top.get("truncate", scaling.get("truncate", True))),
            attention_factor=None if att is None else float(att))
    raise ModelFormatError(f"RoPE type {rtype!r} is not supported (default, linear, yarn, llama3, proportional)")


def _layers(types: list[str], window: int | None, thetas: dict, rope_full: bool = True,
            geometry: dict[int, dict] | None = None) -> tuple[LayerSpec, ...]:
    """LayerSpecs from layer types; thetas: type -> (theta, scale[, scaling]);
    geometry: layer -> LayerSpec overrides (head_dim, kv_heads, kv_source, k_eq_v)."""
    out = []
    for i, t in enumerate(types):
        if t not in (_FULL, _SLIDING):
            raise ModelFormatError(f"layer {i}: unsupported layer type {t!r}")
        sliding = t == _SLIDING
        if sliding and not window:
            raise ModelFormatError(f"layer {i}: sliding layer but the config has no sliding_window")
        theta, scale, *rest = thetas[t]
        out.append(LayerSpec(index=i, kind="sliding" if sliding else "full",
                             window=int(window) if sliding else None,
                             rope=sliding or rope_full, rope_theta=theta, rope_scale=scale,
                             rope_scaling=rest[0] if rest else None, **(geometry or {}).get(i, {})))
    return tuple(out)
