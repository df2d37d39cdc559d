"""Shift turns: a long chat at a small context, per --shift-keep value.

For each value, serves the model in-process (a real uvicorn on 127.0.0.1) with
--max-context and one slot, then plays a --turns-turn greedy chat (each reply
appended as the assistant's message).  Reports how many turns after the first
were served from the slot's cache (cached_tokens > 0), how many context shifts
rebuilt it (the final context_epoch) and the wall time.  `--keep 1` is the old
policy (drop only the minimum).

    python benchmarks/shift_turns.py                 # gemma3-270m, 20 turns at 512, keep 1 and 0.7
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "server"))

TOPICS = ["rivers", "clocks", "bread", "trains", "owls", "salt", "glass", "maps", "bees", "tea",
          "wool", "snow", "bells", "kites", "moss", "ink", "rope", "figs", "coal", "jade"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--max-context", type=int, default=512)
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--keep", type=float, nargs="+", default=[1.0, 0.7])
    args = ap.parse_args()
    import muser
    from muser.backends.defaults import default_dtype, default_quant
    from server_harness import serve                  # tests/server: uvicorn in a thread
    dtype = default_dtype("cpu")
    engine = muser.load(args.model, device="cpu", dtype=dtype, quant=default_quant("cpu", dtype))
    print(f"| --shift-keep | turns from the cache (of {args.turns - 1}) | rebuilds (final epoch) | "
          "wall (s) |\n|---:|---:|---:|---:|")
    for keep in args.keep:
        with serve(engine, model_id="m", slots=1, max_context=args.max_context, shift_keep=keep) as srv:
            c = srv.client()
            msgs = [{"role": "system", "content": "Answer in one short sentence."}]
            cached, epoch, t0 = [], 0, time.time()
            for t in (TOPICS * (args.turns // len(TOPICS) + 1))[:args.turns]:
                msgs.append({"role": "user", "content": f"Tell me one fact about {t}, please."})
                r = c.chat.completions.create(model="m", messages=msgs, max_tokens=args.max_tokens,
                                              temperature=0)
                msgs.append({"role": "assistant", "content": r.choices[0].message.content})
                cached.append(r.usage.prompt_tokens_details.cached_tokens)
                epoch = r.model_extra["muser"]["context_epoch"]
            hits = sum(1 for x in cached[1:] if x > 0)
            print(f"| {keep:g} | {hits} | {epoch} | {time.time() - t0:.1f} |")
    print(f"load average: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
