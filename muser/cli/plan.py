"""`muser cache-plan`: cost curves of a model's planes from its config alone.

Owns: the `cache-plan` subcommand (`add_plan_command(subparsers)`), building a
`CacheGeometry` from a model's header (GGUF metadata or config.json -- no
weights are read), printing the plan, drawing the curves.
"""
from __future__ import annotations

import argparse
import json

from ..cache.plan import DTYPE_BYTES, CacheGeometry, curve, plan
from ..engine.loader import DEFAULT_MODEL, resolve
from ..errors import ModelFormatError


def spec_for(model: str, max_context: int | None):
    _, path = resolve(model)
    if path.is_file():
        from ..model.spec_gguf import spec_from_gguf
        return spec_from_gguf(path, max_context=max_context)
    from ..model.spec import spec_from_hf_config
    return spec_from_hf_config(json.loads((path / "config.json").read_text()), max_context=max_context)


def geometry(spec, dtype: str, max_context: int | None = None) -> CacheGeometry:
    if dtype not in DTYPE_BYTES:
        raise ModelFormatError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
    uniform = spec.uniform_geometry
    return CacheGeometry(tuple(l.window if l.kind == "sliding" else None for l in spec.layers),
                         spec.num_kv_heads, spec.head_dim, DTYPE_BYTES[dtype],
                         min(max_context or spec.max_context, spec.max_context),
                         layer_rows=None if uniform else tuple((l.kv_heads, l.head_dim) for l in spec.layers),
                         shared=None if uniform else tuple(not l.owns_plane for l in spec.layers))


def _mib(n: int) -> str:
    return f"{n:,} B ({n / 2**20:,.1f} MiB)"


def run_cache_plan(args) -> int:
    spec = spec_for(args.model, args.max_context)
    g = geometry(spec, args.dtype, args.max_context)
    p = plan(g, args.context)
    rows = sorted({g.layer_row_bytes(i) for i in range(len(g.windows))})
    shared = f" + {p.shared_layers} KV-shared" if p.shared_layers else ""
    print(f"model {args.model} ({spec.architecture}): {p.sliding_layers} sliding + {p.full_layers} full layers"
          f"{shared}, row {' / '.join(map(str, rows))} B ({args.dtype}), max context {g.max_context:,}")
    print(f"at {p.context:,} tokens:")
    print(f"  sliding planes  {_mib(p.sliding_bytes)}")
    print(f"  full planes     {_mib(p.full_bytes)}")
    if p.shared_layers:
        print(f"  shared planes   0 B: {p.shared_layers} layers read an earlier layer's plane "
              f"(saves {_mib(p.shared_saved_bytes)})")
    print(f"  total           {_mib(p.total_bytes)}")
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        pts = curve(g)
        xs = [q.context for q in pts]
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot(xs, [q.sliding_bytes / 2**20 for q in pts], label="sliding (ring) planes")
        ax.plot(xs, [q.full_bytes / 2**20 for q in pts], label="full (growing) planes")
        ax.axvline(args.context, color="grey", ls=":", lw=1)
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("KV bytes (MiB)")
        ax.set_title(f"{args.model}: KV cache vs context ({args.dtype})")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"plot written to {args.plot}")
    return 0


def add_plan_command(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("cache-plan", help="bytes of the sliding and full planes at N tokens (config only)")
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL)
    p.add_argument("--context", type=int, required=True)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--max-context", type=int, default=None)
    p.add_argument("--plot", default=None, help="draw both cost curves to this PNG")
    p.set_defaults(func=run_cache_plan)
    return p
