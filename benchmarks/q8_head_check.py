"""Does quant="int8-head" give a model the bf16 engine's logits, and if not, where do they part?
(CUDA; the thirty-seventh session's diagnosis of the embedded 270M, kept as a tool.)

Loads the model twice (bf16, int8-head) and compares, in order: the head's weights (BlockInt8
dequantized against the bf16 head), the embedding, the head alone at decode-tile and chunk-tile
row counts (`step.head`), a prefill's logits and K/V rows, then two decode steps.  A head not
stored as Q8_0 is expected to part at the first line; a Q8_0 head (the embedded 270M's)
should agree everywhere.

    PYTHONPATH=. python3 benchmarks/q8_head_check.py [MODEL]      # default: gemma3-270m
"""
import sys

import torch

import muser


def main(path: str) -> None:
    bf = muser.load(path, device="cuda", dtype="bfloat16", progress=False)
    h8 = muser.load(path, device="cuda", dtype="bfloat16", quant="int8-head", progress=False)
    W, B = bf.weights.output, h8.weights.output
    ne = B.dequantized(torch.bfloat16) != W
    print(f"head weights equal: {not bool(ne.any())} (differing {int(ne.sum())})", flush=True)
    print(f"embedding equal: {bool(torch.equal(bf.weights.embed, h8.weights.embed))}")
    sb, sh = bf.backend.runner(bf).step, h8.backend.runner(h8).step
    g = torch.Generator(device="cuda").manual_seed(0)
    for rows in (1, 2, 11, 16, 17, 64):         # decode tiles below 64 rows, chunk tiles from 64
        x = torch.randn(rows, W.shape[1], device="cuda", generator=g).to(torch.bfloat16)
        a, b = sb.head(x), sh.head(x)
        print(f"head at {rows} rows: equal {bool(torch.equal(a, b))}, differing "
              f"{int((a != b).sum())}, largest {float((a - b).abs().max()):.3g}", flush=True)
    ids = bf.tokenizer.encode("The quick brown fox jumps over the lazy dog because")
    a, b = bf.new_session(), h8.new_session()
    la, lb = a.prefill(ids), b.prefill(ids)
    print(f"prefill logits equal: {bool(torch.equal(la, lb))} (differing {int((la != lb).sum())})")
    same = [bool(torch.equal(x, y)) for pa, pb in zip(a.planes, b.planes)
            for x, y in zip(pa.logical_rows(), pb.logical_rows())]
    print(f"K/V rows equal: {all(same)} ({same.count(False)} of {len(same)} differ)")
    for t in (5, 17):
        da, db = a.decode(t), b.decode(t)
        print(f"decode {t}: equal {bool(torch.equal(da, db))} (differing {int((da != db).sum())})")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "gemma3-270m")
