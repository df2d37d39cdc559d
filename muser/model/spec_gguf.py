"""The layer map from a GGUF header: `spec_from_gguf` -> the frozen `ModelSpec`.

Owns: reading a GGUF's metadata (`gguf_meta`) and turning it into the spec that `spec.py` would
build from the same model's `config.json` -- through spec.py's helpers (`_eos`, `_gemma4`),
spec_layers.py's layer rules (`_layers`, `_layer_types`) and Gemma 3's published conventions (a
GGUF of Gemma 3 carries no sliding pattern and no local RoPE base, so they fill those in).  Does not own: tensors (`gguf_loader`) or any
decision spec.py makes for both sources.
"""
from __future__ import annotations

import math
from pathlib import Path

from muser.config import ModelSpec, MoeSpec, RopeScaling
from muser.errors import ModelFormatError
from muser.model.spec import (GEMMA3_END_OF_TURN, GEMMA3_GLOBAL_BASE, GEMMA3_LOCAL_BASE,
                              GEMMA3_SLIDING_PATTERN, _eos, _gemma4)
from muser.model.spec_layers import _FULL, _SLIDING, _layer_types, _layers


def _open(reader_or_path):
    if isinstance(reader_or_path, (str, Path)):
        from muser.model.gguf_file import GGUFFile
        return GGUFFile(reader_or_path)
    return reader_or_path


def gguf_meta(reader, key: str, default=None):
    """One metadata value from a `GGUFFile` or a `gguf.GGUFReader`."""
    fields = reader.fields
    if key not in fields:
        return default
    f = fields[key]
    if hasattr(f, "contents"):                 # gguf.GGUFReader's ReaderField
        return f.contents()
    return f


def spec_from_gguf(reader_or_path, max_context: int | None = None) -> ModelSpec:
    """A `ModelSpec` from a GGUF header: gemma3, and llama/qwen2-style archs (all full attention)."""
    r = _open(reader_or_path)
    arch = gguf_meta(r, "general.architecture")

    def m(key, default=None):
        return gguf_meta(r, f"{arch}.{key}", default)

    n, hidden = m("block_count"), m("embedding_length")
    heads = m("attention.head_count")
    if None in (n, hidden, heads):
        raise ModelFormatError(f"GGUF of arch {arch!r} lacks block_count / embedding_length / head_count")
    kv = m("attention.head_count_kv", heads)
    head_dim = m("attention.key_length", hidden // heads)
    names = {t.name for t in r.tensors}
    # ggml order: token_embd is [ne0 = hidden, ne1 = vocab]
    vocab = m("vocab_size") or next(int(t.shape[1]) for t in r.tensors if t.name == "token_embd.weight")
    ctx = int(max_context or m("context_length", 8192))
    bos = gguf_meta(r, "tokenizer.ggml.bos_token_id")
    eos = _eos(gguf_meta(r, "tokenizer.ggml.eos_token_id"))
    if arch == "gemma4":                       # per-layer arrays: read as a transformers config
        from .gguf_gemma4 import gemma4_config
        cfg = gemma4_config(r, m, names, dict(vocab_size=int(vocab), norm_eps=float(m(
            "attention.layer_norm_rms_epsilon", 1e-6)), bos_token_id=bos, eos_token_ids=eos,
            tie_embeddings="output.weight" not in names))
        return _gemma4(cfg, {}, int(n), int(hidden), int(heads), int(cfg["num_key_value_heads"]), ctx)
    ffn = m("feed_forward_length") or m("expert_feed_forward_length")
    common = dict(vocab_size=int(vocab), hidden_size=int(hidden), intermediate_size=int(ffn),
                  num_heads=int(heads), num_kv_heads=int(kv), head_dim=int(head_dim), max_context=ctx,
                  norm_eps=float(m("attention.layer_norm_rms_epsilon", 1e-6)),
                  tie_embeddings="output.weight" not in names, bos_token_id=bos)
    if arch == "gemma3":
        # The GGUF has no pattern and no local base: Gemma 3's conventions, as transformers does.
        thetas = {_SLIDING: (GEMMA3_LOCAL_BASE, 1.0), _FULL: (float(m("rope.freq_base", GEMMA3_GLOBAL_BASE)), 1.0)}
        rs = m("rope.scaling.type")
        if rs == "linear":
            thetas[_FULL] = (thetas[_FULL][0], float(m("rope.scaling.factor")))
        if not eos:
            eos = (1,)
        eos = tuple(dict.fromkeys(eos + (1, GEMMA3_END_OF_TURN)))
        # query_pre_attn_scalar is not in the file: head_dim for 270M..12B; 27B (62 layers) uses
        # hidden / heads -- llama.cpp's rule, which keys on the layer count the same way.
        qpas = hidden / heads if int(n) == 62 else head_dim
        pattern = m("attention.sliding_window_pattern", GEMMA3_SLIDING_PATTERN)
        if isinstance(pattern, int):
            types = _layer_types(int(n), pattern)
        else:                                   # newer converters: one flag per layer, true = sliding
            types = [_SLIDING if bool(x) else _FULL for x in pattern]
        return ModelSpec(architecture="gemma3", layers=_layers(types, m("attention.sliding_window"), thetas),
                         eos_token_ids=eos, embed_scale=math.sqrt(hidden), query_scale=float(qpas) ** -0.5,
                         final_logit_softcap=m("final_logit_softcapping"),   # no attention cap: see above
                         activation="gelu_tanh", norm="rms", qk_norm=True, sandwich_norm=True, **common)
    if arch in ("llama", "qwen2", "mistral"):
        rope = (float(m("rope.freq_base", 10_000.0)), 1.0)
        if m("rope.scaling.type") == "linear":
            rope = (rope[0], float(m("rope.scaling.factor")))
        elif m("rope.scaling.type") not in (None, "none"):
            raise ModelFormatError(f"RoPE scaling {m('rope.scaling.type')!r} is not supported")
        window = m("attention.sliding_window")
        types = [_SLIDING if window else _FULL] * int(n)
        return ModelSpec(architecture=arch, layers=_layers(types, window, {_SLIDING: rope, _FULL: rope}),
                         eos_token_ids=eos, attention_bias="blk.0.attn_q.bias" in names, **common)
    if arch == "gpt-oss":
        # llama.cpp's gpt-oss: sliding on even layers (its swa pattern 2, as transformers'
        # layer_types), YaRN on every layer (gpt-oss's own untruncated ramp), sinks, experts.
        scaling = None
        if m("rope.scaling.type") == "yarn":
            scaling = RopeScaling("yarn", factor=float(m("rope.scaling.factor")),
                                  original_context=int(m("rope.scaling.original_context_length", 4096)),
                                  beta_fast=float(m("rope.scaling.yarn_beta_fast", 32.0)),
                                  beta_slow=float(m("rope.scaling.yarn_beta_slow", 1.0)), truncate=False)
        elif m("rope.scaling.type") not in (None, "none"):
            raise ModelFormatError(f"gpt-oss GGUF RoPE scaling {m('rope.scaling.type')!r} is not supported")
        rope = (float(m("rope.freq_base", 150_000.0)), 1.0, scaling)
        types = [_SLIDING if i % 2 == 0 else _FULL for i in range(int(n))]
        moe = MoeSpec("gpt_oss", int(m("expert_count")), int(m("expert_used_count")),
                      int(m("expert_feed_forward_length") or ffn))
        return ModelSpec(architecture="gpt_oss", layers=_layers(types, m("attention.sliding_window", 128),
                                                                {_SLIDING: rope, _FULL: rope}),
                         eos_token_ids=eos, attention_bias=True, attention_sinks=True, moe=moe, **common)
    raise ModelFormatError(f"GGUF architecture {arch!r} is not supported (gemma3, gemma4, gpt-oss, llama, "
                           "qwen2)")
