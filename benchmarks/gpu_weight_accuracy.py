"""What a GPU weight mode would cost in accuracy (issue 17, item 2), measured on the CPU: the
embedded model's projection and head weights replaced by what each mode stores, everything
else float32, against float32 -- so each row is the weights' error alone.

    PYTHONPATH=. python3 benchmarks/gpu_weight_accuracy.py

Modes (per output row; the embedding lookup keeps its float table, the head gets its own copy):
  bf16          the CUDA default's weights (each weight rounded to bfloat16)
  int8-row      symmetric int8, scale = max|w| / 127 per row (1 byte a weight + 4 a row)
  fp8-row       float8 e4m3, scale = max|w| / 448 per row (1 byte a weight + 4 a row)
  int8-row+bf16-head   int8-row projections, the head bfloat16 (the head is 62% of the 270M's bytes)
  bf16+int8-head       bf16 projections, the head int8-row (quant="int8-head-fast"'s weights:
                       the rows' K/V bits are bf16's, only the logits move)
  bf16+int8gN-head     the same with a scale per N keys of a row (N = 128, 32: Q8_0's blocks)
  bf16+q8_0-head       int8 with a float16 scale per 32 keys, dequantized to bf16 in the tile
                       (quant="int8-head")
Teacher-forced logits of the 400-token text fast_path_accuracy.py uses: max / mean |logit error|,
the worst row's max error over the f32 logit range, top-1 agreement, KL(f32 || mode); then the
first token where greedy parts from f32's, of 32, for its 5 prompts.
"""
from __future__ import annotations

import torch

import muser
from fast_path_accuracy import PROMPTS, _all_logits, errors, text_ids

PROJ = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


def bf16(w):
    return w.to(torch.bfloat16).float()


def int8_row(w):
    s = w.abs().amax(1, keepdim=True).clamp_min(1e-12) / 127
    return (w / s).round().clamp(-127, 127) * s


def int8_group(n):
    """Symmetric int8 with a scale per n keys of a row (Q8_0's layout at n = 32)."""
    def q(w):
        g = w.reshape(w.shape[0], -1, n)
        s = g.abs().amax(2, keepdim=True).clamp_min(1e-12) / 127
        return ((g / s).round().clamp(-127, 127) * s).reshape(w.shape)
    return q


def q8_0_bf16(w):
    """quant="int8-head" as the kernel computes it: int8 with a float16 scale per 32 keys
    (Q8_0's blocks), each weight dequantized to bfloat16 in the tile: bf16(q * s)."""
    g = w.reshape(w.shape[0], -1, 32)
    s = (g.abs().amax(2, keepdim=True) / 127).to(torch.float16).float()
    q = torch.where(s > 0, g / s.clamp_min(1e-30), torch.zeros_like(g)).round().clamp(-127, 127)
    return (q * s).to(torch.bfloat16).float().reshape(w.shape)


def fp8_row(w):
    s = w.abs().amax(1, keepdim=True).clamp_min(1e-12) / 448
    return (w / s).to(torch.float8_e4m3fn).float() * s


MODES = {"bf16": (bf16, bf16), "int8-row": (int8_row, int8_row), "fp8-row": (fp8_row, fp8_row),
         "int8-row+bf16-head": (int8_row, bf16), "bf16+int8-head": (bf16, int8_row),
         "bf16+int8g128-head": (bf16, int8_group(128)), "bf16+int8g32-head": (bf16, int8_group(32)),
         "bf16+q8_0-head": (bf16, q8_0_bf16)}


def apply(engine, proj, head):
    w = engine.weights
    for lw in w.layers:
        for name in PROJ:
            t = getattr(lw, name)
            if isinstance(t, torch.Tensor):
                setattr(lw, name, proj(t.float()))
    w.lm_head = head(w.output.float())          # the lookup keeps the float embedding


def main() -> None:
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--modes", default=",".join(MODES),
                    help="comma-separated, of " + ", ".join(MODES))
    modes = ap.parse_args().modes.split(",")
    ref = muser.load("gemma3-270m", dtype="float32", quant="none", progress=False)
    tok = ref.tokenizer
    ids = text_ids(tok)
    r = _all_logits(ref, ids, 64)
    greedy_ref = [list(ref.stream(tok.encode(p), max_tokens=32)) for p in PROMPTS]
    print("| mode | max abs err | mean abs err | worst row max / range | top-1 | KL mean | KL max | greedy parts at (of 32) |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for name in modes:
        proj, head = MODES[name]
        eng = muser.load("gemma3-270m", dtype="float32", quant="none", progress=False)
        apply(eng, proj, head)
        e = errors(_all_logits(eng, ids, 64), r)
        first = []
        for p, a in zip(PROMPTS, greedy_ref):
            b = list(eng.stream(tok.encode(p), max_tokens=32))
            first.append(next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), 32))
        print(f"| {name} | {e['max']:.3f} | {e['mean']:.4f} | {e['worst']:.4f} | {e['top1']:.4f} | "
              f"{e['kl']:.2e} | {e['kl_max']:.2e} | {first} |", flush=True)


if __name__ == "__main__":
    main()
