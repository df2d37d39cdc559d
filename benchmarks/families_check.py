"""Accuracy of the families at real widths on the GPU: muser bf16 (chunks, the fused decode step)
and transformers bf16 against transformers float32 as the oracle (full recompute every step: no
cache API in the way), at full width with few layers (so the float32 oracle fits beside them).

    PYTHONPATH=. python3 benchmarks/families_check.py [--models gpt-oss-20b,gemma4-26b-a4b]
        [--layers 2] [--prompt 300] [--steps 6]

Prints, per model: relative error of the last prompt row and of each greedy step, and whether
the argmax agrees, for muser (prefill chunk 32 / default chunk, then decode) and transformers bf16.
"""
from __future__ import annotations

import argparse
import copy

import torch

from cuda_measure import rand_ids
from families_cuda_bench import build


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


@torch.no_grad()
def main(argv=None):
    from muser.engine.loader import from_state_dict
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="gpt-oss-20b,gemma4-26b-a4b")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=300)
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args(argv)
    for name in args.models.split(","):
        ref, d = build(name, 4096, layers=args.layers, dtype=torch.float32)
        hf16 = copy.deepcopy(ref).to(torch.bfloat16)
        eng = from_state_dict(d, hf16.state_dict(), device="cuda", dtype="bfloat16", max_context=4096)
        vocab = d["vocab_size"]
        ids = rand_ids(args.prompt, vocab, 3)
        print(f"{name} ({args.layers} layers, full width): fused decode step "
              f"{eng.decode_runner() is not None}", flush=True)
        for chunk in (32, None):
            s = eng.new_session()
            seq = list(ids)
            mine = s.prefill(seq, chunk_size=chunk)
            rows = []
            for i in range(args.steps + 1):
                want = ref(torch.tensor([seq], device="cuda")).logits[0, -1].float()
                theirs = hf16(torch.tensor([seq], device="cuda")).logits[0, -1].float()
                rows.append(f"{rel(mine, want):.2e}/{rel(theirs, want):.2e}"
                            f"{'' if int(mine.argmax()) == int(want.argmax()) else '!'}")
                if i == args.steps:
                    break
                tok = int(want.argmax())
                seq.append(tok)
                mine = s.decode(tok)
            print(f"  chunk {chunk or 'default'}: muser/hf-bf16 rel err vs hf-f32, prompt then steps "
                  f"(! = muser argmax differs): {' '.join(rows)}", flush=True)
        del ref, hf16, eng
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
