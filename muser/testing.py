"""Tiny real models for tests and examples: random weights, a real trained tokenizer.

Owns: `tiny_model_dir(...)` (a Hugging Face model directory written by
transformers' own `save_pretrained`, with a small BPE tokenizer trained by
`tokenizers` and a Gemma-style chat template) and `tiny_model(...)` (the same,
loaded as a muser Engine).  Directories are cached per argument set for the
life of the process.  Does not own: anything the engine needs at run time.
"""
from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path

CORPUS = (
    "the quick brown fox jumps over the lazy dog. hybrid attention mixes sliding windows "
    "with full layers. a ring keeps the last tokens; a growing plane keeps them all. "
    "def add(a, b):\n    return a + b\n# comments explain the why. 0 1 2 3 4 5 6 7 8 9 "
    "user model system assistant hello world! how are you? fine, thanks. "
) * 4
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}{{ '<start_of_turn>system\n' + "
    "m['content'] + '<end_of_turn>\n' }}{% else %}{{ '<start_of_turn>' + ('model' if m['role'] == "
    "'assistant' else m['role']) + '\n' + m['content'] + '<end_of_turn>\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)


def _write_tokenizer(path: Path, vocab: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([CORPUS], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>", unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)


@functools.lru_cache(maxsize=None)
def tiny_model_dir(arch: str = "gemma3", layers: int = 6, window: int = 4, vocab: int = 384,
                   hidden: int = 64, heads: int = 4, kv_heads: int = 2, head_dim: int = 16,
                   max_context: int = 256, seed: int = 0, tokenizer: bool = True) -> Path:
    import torch
    import transformers as tr
    path = Path(tempfile.mkdtemp(prefix=f"muser-tiny-{arch}-"))
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                  num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                  head_dim=head_dim, max_position_embeddings=max_context, sliding_window=window,
                  pad_token_id=0, eos_token_id=1, bos_token_id=2, tie_word_embeddings=True)
    if arch == "gemma3":
        types = ["full_attention" if (i + 1) % 3 == 0 else "sliding_attention" for i in range(layers)]
        cfg = tr.Gemma3TextConfig(layer_types=types, query_pre_attn_scalar=head_dim,
                                  rope_theta=10000.0, **common)
        model = tr.Gemma3ForCausalLM(cfg)
    elif arch == "cohere2":
        types = ["full_attention" if (i + 1) % 3 == 0 else "sliding_attention" for i in range(layers)]
        common.pop("head_dim")
        cfg = tr.Cohere2Config(layer_types=types, logit_scale=0.5, **common)
        model = tr.Cohere2ForCausalLM(cfg)
    elif arch == "llama":
        common.pop("sliding_window")
        model = tr.LlamaForCausalLM(tr.LlamaConfig(**common))
    else:
        raise ValueError(f"arch must be gemma3, cohere2 or llama, got {arch!r}")
    # Random init leaves some norms at exactly 0 / 1; perturb so parity tests see every weight.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(path, safe_serialization=True)
    if tokenizer:
        _write_tokenizer(path, vocab)
    (path / "muser-tiny.json").write_text(json.dumps({"arch": arch, "seed": seed}))
    return path


def tiny_model(arch: str = "gemma3", device: str = "cpu", dtype: str = "float32",
               backend: str = "ring", chunk_size: int = 512, quant: str = "none", **kw):
    from .engine import load
    return load(str(tiny_model_dir(arch, **kw)), device=device, dtype=dtype, backend=backend,
                chunk_size=chunk_size, quant=quant, progress=False)
