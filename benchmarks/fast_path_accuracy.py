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


def text_ids(tok) -> list[int]:
    """The 400 teacher-forced tokens: code (muser's staging.py) and prose."""
    text = (Path(muser.__file__).parent / "cache" / "staging.py").read_text()[:1200]
    text += "\n\nThe history of the Roman Empire spans many centuries. " * 3
    return tok.encode(text)[:400]


def errors(got, r) -> dict:
    """max / mean |err|, the worst row's max over its f32 logit range, top-1, KL(f32 || got)."""
    err = (got - r).abs()
    rng = r.max(-1).values - r.min(-1).values
    kl = F.kl_div(got.log_softmax(-1), r.log_softmax(-1), log_target=True, reduction="none").sum(-1)
    return {"max": err.max(), "mean": err.mean(), "worst": (err.max(-1).values / rng).max(),
            "top1": (got.argmax(-1) == r.argmax(-1)).float().mean(), "kl": kl.mean(), "kl_max": kl.max()}


def main() -> None:
    ref = muser.load("gemma3-270m", dtype="float32", quant="none", progress=False)
    fast = muser.load("gemma3-270m", progress=False)
    tok = ref.tokenizer
    ids = text_ids(tok)
    r = _all_logits(ref, ids, 64)
    for chunk in (64, 400):
        e = errors(_all_logits(fast, ids, chunk), r)
        print(f"chunks of {chunk}: max |err| {e['max']:.3f}  mean {e['mean']:.4f}  worst row max/range "
              f"{e['worst']:.4f}  top-1 {e['top1']:.4f}  KL mean {e['kl']:.2e} max {e['kl_max']:.2e}")
    first = []
    for p in PROMPTS:
        a = list(ref.stream(tok.encode(p), max_tokens=32))
        b = list(fast.stream(tok.encode(p), max_tokens=32))
        first.append(next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), 32))
    print("greedy: first differing token of 32 per prompt:", first)


if __name__ == "__main__":
    main()
