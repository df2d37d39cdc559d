"""Per-token cost of constrained decoding on the CPU default path (embedded model, bf16 + int8).

Generates greedy JSON under a schema (and under "any JSON object"), token by token, timing
separately the model's decode step (`session.decode`) and the token choice (`TokenPicker.pick`:
grammar mask over the 262,144-token vocabulary, masked argmax, matcher advance).  The same
loop without a grammar gives the plain choice's cost.  Overhead = (constrained pick - plain
pick) / decode step.  Also: the whole loop's tokens/s with and without a grammar.

    python benchmarks/constrained_bench.py --tokens 64 --repeats 3
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import muser
from muser.engine.constrained import Grammar
from muser.engine.picker import TokenPicker
from muser.engine.sampling import SamplingParams

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "email": {"type": "string", "pattern": "^[a-z]+@[a-z]+\\.com$"}, "role": {"enum": ["admin", "user"]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
    "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                "required": ["city"], "additionalProperties": False}},
    "required": ["name", "age", "email", "role", "tags", "address"], "additionalProperties": False}
PROMPT = ("<start_of_turn>user\nDescribe a fictional employee as JSON with name, age, email, role, "
          "tags and address.<end_of_turn>\n<start_of_turn>model\n")


def run(engine, grammar, tokens: int, temperature: float):
    ids = engine.tokenizer.encode(PROMPT)
    s = engine.new_session()
    logits = s.prefill(ids)
    c = engine.grammars.constraint(grammar) if grammar is not None else None
    p = TokenPicker(SamplingParams(temperature, seed=0), constraint=c)
    picks, steps, n = [], [], 0
    t_all = time.perf_counter()
    for _ in range(tokens):
        t = time.perf_counter()
        tok = p.pick(logits).token
        picks.append(time.perf_counter() - t)
        n += 1
        if p.stopped or tok in engine.spec.eos_token_ids:
            break
        t = time.perf_counter()
        logits = s.decode(tok)
        steps.append(time.perf_counter() - t)
    return picks, steps, n / (time.perf_counter() - t_all)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--temperature", type=float, default=0.0)
    args = ap.parse_args()
    torch.set_num_threads(2)
    engine = muser.load("gemma3-270m")
    engine.grammars.tokenizer                                  # built once, not timed
    ms = lambda xs: 1e3 * statistics.median(xs)               # noqa: E731
    mean = lambda xs: 1e3 * statistics.fmean(xs)              # noqa: E731
    rows = {}
    for name, g in (("plain", None), ("json_object", Grammar("json_object")),
                    ("schema", Grammar.json_schema(SCHEMA))):
        picks, steps, rates = [], [], []
        for _ in range(args.repeats):
            a, b, r = run(engine, g, args.tokens, args.temperature)
            picks += a
            steps += b
            rates.append(r)
        rows[name] = (picks, steps, statistics.median(rates))
    step = ms(rows["plain"][1] + rows["json_object"][1] + rows["schema"][1])
    plain_pick = mean(rows["plain"][0])
    print(f"decode step (median over every run): {step:.2f} ms; config {engine.config.dtype}/"
          f"{engine.config.quant}, vocabulary {engine.spec.vocab_size}")
    print("| grammar | tokens | pick ms (median / mean) | overhead vs plain pick, ms (mean) "
          "| overhead / decode step | loop tok/s |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, (picks, steps, rate) in rows.items():
        over = mean(picks) - plain_pick
        print(f"| {name} | {len(picks)} | {ms(picks):.3f} / {mean(picks):.3f} | {over:.3f} | "
              f"{100 * over / step:.1f}% | {rate:.1f} |")
    print("sample output:", json.dumps(engine.generate(PROMPT, max_tokens=args.tokens,
                                                       grammar=Grammar.json_schema(SCHEMA))))


if __name__ == "__main__":
    main()
