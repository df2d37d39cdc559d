"""Greedy continuation of the embedded model: muser (float32) picks the same 16 tokens
as transformers loading the same GGUF.

Short prompts: full recompute every step (`forward_reference`).  The prompt longer
than the 512 window: prefill once, then T=1 steps through a plain list of k/v per
layer and the reference attention -- the way a session drives `layer_forward`
(full recompute of 550 tokens x 16 steps is minutes on 2 cores).
"""
from __future__ import annotations

import pytest
import torch

from muser.attention.reference import attention, visibility_mask
from muser.model import transformer as tf
from muser.model.transformer import forward_reference

NEW = 16
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    # longer than the 512-token window, so sliding layers really drop keys
    "Once upon a time, in a small village by the sea, " * 44 + "the old fisherman said",
]


@pytest.mark.slow
def test_greedy_matches_transformers(muser_gguf, gguf_tokenizer, hf_reference, one_thread):
    spec, weights, _ = muser_gguf
    prompts = [gguf_tokenizer.encode(p) for p in PROMPTS]
    assert len(prompts[2]) > 512 + NEW

    def compute(model):
        outs = []
        for ids in prompts:
            x = torch.tensor([ids])
            y = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=NEW, do_sample=False,
                               eos_token_id=None, pad_token_id=0)
            outs.append(y[0, len(ids):].tolist())
        return {"prompts": prompts, "greedy": outs}
    ref = hf_reference("greedy16", compute)
    assert ref["prompts"] == prompts, "tokenizer changed since the reference was cached"

    for ids, want in zip(prompts, ref["greedy"]):
        run = greedy_full_recompute if len(ids) < 64 else greedy_incremental
        got = run(weights, spec, ids, NEW)
        assert got == want, gguf_tokenizer.decode(got) + " vs " + gguf_tokenizer.decode(want)


def greedy_full_recompute(weights, spec, ids, n):
    seq = list(ids)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(forward_reference(weights, spec, seq, all_logits=False)[0].argmax()))
    return seq[len(ids):]


def greedy_incremental(weights, spec, ids, n):
    keys = [None] * spec.num_layers          # per layer: k [S, KV, D], v [S, KV, D] of every position so far
    vals = [None] * spec.num_layers

    def step(tokens, start):
        pos = torch.arange(start, start + len(tokens))
        h = tf.embed(weights, spec, torch.tensor(tokens))
        for i, (lw, ls) in enumerate(zip(weights.layers, spec.layers)):
            def attend(q, k, v, i=i, ls=ls):
                keys[i] = k if keys[i] is None else torch.cat([keys[i], k])
                vals[i] = v if vals[i] is None else torch.cat([vals[i], v])
                mask = visibility_mask(pos, torch.arange(keys[i].shape[0]), ls.window)
                return attention(q, keys[i], vals[i], mask, spec.scale)
            h = tf.layer_forward(lw, spec, ls, h, pos, attend)
        return int(tf.logits(weights, spec, tf.final_hidden(weights, spec, h[-1:]))[0].argmax())

    out = []
    with torch.no_grad():
        out.append(step(list(ids), 0))
        while len(out) < n:
            out.append(step([out[-1]], len(ids) + len(out) - 1))
    return out
