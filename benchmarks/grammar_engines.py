"""Per-token mask cost of three grammar engines on the embedded Gemma vocabulary (262,144 tokens).

For each engine (llguidance, xgrammar, outlines-core) and each grammar (any JSON object; a nested
schema with enums, numbers, arrays and a pattern), the script replays one valid document token by
token -- the document's own Gemma tokenization -- and times, per token: computing the allowed-token
mask, applying it to a float32 [262144] logits vector (what the sampler would see), and advancing the
matcher with the token.  Also: tokenizer-info build time and grammar compile time (first use).

    python benchmarks/grammar_engines.py                     # engines importable in this env
    PYTHONPATH=/tmp/bench_pkgs python benchmarks/grammar_engines.py --engines llguidance,xgrammar,outlines

xgrammar and outlines-core are not dependencies of muser; install them to a side folder to compare
(`pip install --no-deps --target /tmp/bench_pkgs xgrammar apache-tvm-ffi outlines-core`).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "pattern": "^[a-z]+@[a-z]+\\.com$"},
        "role": {"enum": ["admin", "user", "guest"]},
        "scores": {"type": "array", "items": {"type": "number"}},
        "address": {"type": "object",
                    "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                    "required": ["city", "zip"], "additionalProperties": False},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "email", "role", "scores", "address", "active"],
    "additionalProperties": False,
}
DOC = {"name": "Ada Lovelace, Countess of Lovelace", "age": 36, "email": "ada@analytical.com",
       "role": "admin", "scores": [9.5, 7.25, 10, 3.125], "address": {"city": "London",
       "zip": "W1 4AB"}, "active": True}
ANY_OBJECT = {"type": "object"}
ANY_DOC = {"tool": "search", "args": {"query": "hybrid attention", "limit": 5, "filters": [
    "recent", "peer-reviewed"]}, "notes": "two lines\nof text", "ok": None}


def gemma_tokenizer():
    from muser.engine.loader import resolve
    from muser.model.tokenizer import load_tokenizer
    return load_tokenizer(resolve("gemma3-270m")[1])


def timeit(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


class LLG:
    name = "llguidance"

    def __init__(self, tok):
        import llguidance
        import llguidance.hf
        self.ll = llguidance
        self.tok, self.t_info = timeit(lambda: llguidance.hf.from_tokenizer(tok.hf))
        self.vocab = tok.vocab_size

    def compile(self, schema):
        g = self.ll.LLMatcher.grammar_from_json_schema(schema)
        m = self.ll.LLMatcher(self.tok, g)
        assert not m.is_error(), m.get_error()
        self.m, self.mask = m, torch.full(((self.vocab + 31) // 32,), -1, dtype=torch.int32)
        self.bits = np.empty(self.mask.numel() * 32, dtype=np.uint8)

    def fill(self):
        self.m.unsafe_compute_mask_ptr(self.mask.data_ptr(), self.mask.numel() * 4)

    def apply(self, logits):                 # what muser ships (engine/constrained.py)
        bits = np.unpackbits(self.mask.numpy().view(np.uint8), bitorder="little")[:logits.numel()]
        np.copyto(logits.numpy(), -np.inf, where=bits == 0)

    def advance(self, t):
        assert self.m.consume_token(t), self.m.get_error()


class XGR:
    name = "xgrammar"

    def __init__(self, tok):
        import xgrammar as xgr
        self.xgr = xgr
        self.info, self.t_info = timeit(lambda: xgr.TokenizerInfo.from_huggingface(
            tok.hf, vocab_size=tok.vocab_size))
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=2)
        self.vocab = tok.vocab_size

    def compile(self, schema):
        c = self.compiler.compile_json_schema(json.dumps(schema), strict_mode=True)
        self.m = self.xgr.GrammarMatcher(c)
        self.mask = self.xgr.allocate_token_bitmask(1, self.vocab)

    def fill(self):
        self.m.fill_next_token_bitmask(self.mask)

    def apply(self, logits):
        self.xgr.apply_token_bitmask_inplace(logits.view(1, -1), self.mask)

    def advance(self, t):
        assert self.m.accept_token(t)


def token_bytes(tok) -> list[bytes]:
    """Bytes of every token of a sentencepiece-style (Gemma) vocabulary: U+2581 is a space,
    <0xHH> a raw byte; special tokens get no bytes."""
    out = []
    special = set(tok.hf.all_special_ids)
    for i, piece in enumerate(tok.hf.convert_ids_to_tokens(list(range(tok.vocab_size)))):
        if i in special or piece is None:
            out.append(b"")
        elif len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            out.append(bytes([int(piece[3:5], 16)]))
        else:
            out.append(piece.replace("\u2581", " ").encode())
    return out


class OUT:
    name = "outlines-core"

    def __init__(self, tok):
        import outlines_core as oc
        self.oc = oc
        eos = tok.hf.eos_token_id

        def build():
            vocab: dict[bytes, list[int]] = {}
            for i, b in enumerate(token_bytes(tok)):
                if b and i != eos:
                    vocab.setdefault(b, []).append(i)
            return oc.Vocabulary(eos, vocab)
        self.v, self.t_info = timeit(build)
        self.vocab = tok.vocab_size

    def compile(self, schema):
        from outlines_core.json_schema import build_regex_from_schema
        rx = build_regex_from_schema(json.dumps(schema), r"[\n ]?")
        self.g = self.oc.Guide(self.oc.Index(rx, self.v))
        self.mask = torch.zeros(((self.vocab + 31) // 32,), dtype=torch.int32)

    def fill(self):
        self.g.write_mask_into(self.mask.data_ptr(), self.mask.numel(), self.mask.element_size())

    def apply(self, logits):
        bits = np.unpackbits(self.mask.numpy().view(np.uint8), bitorder="little")[:logits.numel()]
        np.copyto(logits.numpy(), -np.inf, where=bits == 0)

    def advance(self, t):
        self.g.advance(t)


ENGINES = {"llguidance": LLG, "xgrammar": XGR, "outlines": OUT}


def run(engine, tok, schema, doc, repeats: int):
    ids = tok.encode(json.dumps(doc, separators=(",", ":")), add_bos=False)
    _, t_compile = timeit(lambda: engine.compile(schema))
    fills, applies, advances = [], [], []
    logits = torch.randn(tok.vocab_size)
    for r in range(repeats):
        if r:
            engine.compile(schema)
        for t in ids:
            _, a = timeit(engine.fill)
            work = logits.clone()
            _, b = timeit(lambda: engine.apply(work))
            assert torch.isfinite(work[t]), f"{engine.name}: token {t} masked out"
            _, c = timeit(lambda: engine.advance(t))
            fills.append(a), applies.append(b), advances.append(c)
    ms = lambda xs: 1e3 * statistics.median(xs)          # noqa: E731
    p90 = lambda xs: 1e3 * sorted(xs)[int(0.9 * len(xs))]  # noqa: E731
    tot = [a + b + c for a, b, c in zip(fills, applies, advances)]
    return {"tokens": len(ids), "compile_ms": 1e3 * t_compile, "mask_ms": ms(fills),
            "mean_ms": 1e3 * statistics.fmean(tot),
            "apply_ms": ms(applies), "advance_ms": ms(advances), "total_ms": ms(tot),
            "total_p90_ms": p90(tot), "total_max_ms": 1e3 * max(tot)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engines", default="llguidance")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(2)
    tok = gemma_tokenizer()
    print(f"vocabulary {tok.vocab_size}, torch {torch.__version__}")
    print("| engine | grammar | tokenizer info s | compile ms | mask ms | apply ms | advance ms "
          "| per token ms (median / p90 / max) | mean |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.engines.split(","):
        eng = ENGINES[name](tok)
        for gname, schema, doc in (("json_object", ANY_OBJECT, ANY_DOC), ("schema", SCHEMA, DOC)):
            r = run(eng, tok, schema, doc, args.repeats)
            print(f"| {eng.name} | {gname} ({r['tokens']} tok) | {eng.t_info:.2f} | "
                  f"{r['compile_ms']:.1f} | {r['mask_ms']:.3f} | {r['apply_ms']:.3f} | "
                  f"{r['advance_ms']:.3f} | {r['total_ms']:.3f} / {r['total_p90_ms']:.3f} / "
                  f"{r['total_max_ms']:.2f} | {r['mean_ms']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
