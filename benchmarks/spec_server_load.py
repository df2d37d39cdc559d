"""The server's prompt-lookup speculation under concurrency (CPU default: bf16 + int8 on the
embedded 270M): aggregate completion tok/s for 1, 4 and 8 concurrent greedy requests, plain
against `--speculative prompt-lookup`, on an editing workload (the answer copies the prompt) and
a free-form one.  In-process server (tests/server/server_harness.py), 8 slots, 48 new tokens a
request, the second of two runs per level.

    python benchmarks/spec_server_load.py
"""
import sys, time, asyncio
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "tests" / "server"))
import muser
from server_harness import serve
from muser.backends.defaults import default_dtype, default_quant
eng = muser.load("gemma3-270m", dtype=default_dtype("cpu"), quant=default_quant("cpu", default_dtype("cpu")), progress=False)
PASSAGE = ("The ring keeps the last W tokens of every sliding layer, so its memory is flat no matter "
           "how long the conversation grows. The growing plane keeps every token of the full layers.")
def prompt(i, kind):
    if kind == "edit":
        return f"Original text {i}:\n{PASSAGE}\n\nThe same text, copied exactly:\n{PASSAGE[:40]}"
    return f"Write a short poem number {i} about {['rain','trains','the moon','rivers','clocks','bridges','winter','deserts'][i % 8]}."
for spec in (None, "prompt-lookup"):
    with serve(eng, model_id="m", slots=8, output_reserve=64, speculative=spec) as srv:
        for kind in ("edit", "free"):
            for C in (1, 4, 8):
                async def run():
                    ac = srv.async_client()
                    try:
                        t = time.perf_counter()
                        rs = await asyncio.gather(*(ac.completions.create(model="m", prompt=prompt(i, kind), max_tokens=48, temperature=0) for i in range(C)))
                        return time.perf_counter() - t, sum(r.usage.completion_tokens for r in rs)
                    finally:
                        await ac.close()
                asyncio.run(run())   # warm
                dt, n = asyncio.run(run())
                print(f"spec={spec} {kind:5s} C={C}: {n/dt:7.1f} tok/s aggregate", flush=True)
