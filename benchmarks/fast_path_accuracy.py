"""Accuracy of the CPU default path (bf16 activations + int8 weights) against float32, embedded model.

    python benchmarks/fast_path_accuracy.py
    PYTHONPATH=/tmp/base python benchmarks/fast_path_accuracy.py      # another checkout, same figures

Teacher-forced logits of a 400-token code + prose text, fed as extend() chunks of 64 and of 400
rows (on main, chunks of more than 64 rows ran a dense bf16 copy of the weights; on the exact-rows
path both must give the same figures): max / mean |logit error|, the worst row's max error over
the f32 logit range (tests/engine/test_fast_path.py bounds this by 0.05 at a prompt's last
position), top-1 agreement, KL(f32 || fast).  Then greedy continuations of 5 prompts (code from
issue 12, a list, prose): the first token where the fast path parts from f32, of 32.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

import muser

PROMPTS = ["The capital of France is", "def add(a, b):\n    return", "Water boils at a temperature of",
           "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
           "1. apples\n2. bananas\n3."]


def _all_logits(engine, ids, chunk):
    s = engine.new_session()
    return torch.cat([s.extend(ids[i:i + chunk]) for i in range(0, len(ids), chunk)])


def main() -> None:
    ref = muser.load("gemma3-270m", dtype="float32", quant="none", progress=False)
    fast = muser.load("gemma3-270m", progress=False)
    tok = ref.tokenizer
    text = (Path(muser.__file__).parent / "cache" / "staging.py").read_text()[:1200]
    text += "\n\nThe history of the Roman Empire spans many centuries. " * 3
    ids = tok.encode(text)[:400]
    r = _all_logits(ref, ids, 64)
    rng = r.max(-1).values - r.min(-1).values
    for chunk in (64, 400):
        got = _all_logits(fast, ids, chunk)
        err = (got - r).abs()
        kl = F.kl_div(got.log_softmax(-1), r.log_softmax(-1), log_target=True, reduction="none").sum(-1)
        top1 = (got.argmax(-1) == r.argmax(-1)).float().mean()
        print(f"chunks of {chunk}: max |err| {err.max():.3f}  mean {err.mean():.4f}  worst row max/range "
              f"{(err.max(-1).values / rng).max():.4f}  top-1 {top1:.4f}  KL mean {kl.mean():.2e} max {kl.max():.2e}")
    first = []
    for p in PROMPTS:
        a = list(ref.stream(tok.encode(p), max_tokens=32))
        b = list(fast.stream(tok.encode(p), max_tokens=32))
        first.append(next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), 32))
    print("greedy: first differing token of 32 per prompt:", first)


if __name__ == "__main__":
    main()
