"""`muser pack inspect | verify | save`: session packs from the command line.

Owns: the `pack` subcommands (`add_pack_commands(subparsers)`, called by
cli/main.py) and their handlers; each handler returns the exit status.
Does not own: the format (muser.pack.format), the engine (muser.engine) or the
top-level parser and its error policy (cli/main.py).

    muser pack inspect FILE [--json] [--key-file F]   manifest as a table (header checks only)
    muser pack verify FILE [--key-file F]             every check; exit 0, or 1 with the reason
    muser pack save --prompt TEXT --out FILE [--model M] [--key-file F]
                                                      prefill a prompt, save the session's pack

The key comes from --key-file (its bytes, one trailing newline dropped), else
the MUSER_PACK_KEY environment variable, else there is none and packs are
integrity-checked only (and saved unsigned) -- every command says which.
"""
from __future__ import annotations

import argparse
import json
import sys

from ..errors import PackError
from ..pack import format as pf
from ..pack import reader as pr
from ..pack.manifest import load_key
from .args import load_engine, model_args


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return str(n)


def _fail(file: str, e: Exception) -> int:
    print(f"{file}: INVALID: {type(e).__name__}: {e}", file=sys.stderr)
    return 1


def cmd_inspect(args) -> int:
    try:
        info = pr.read_manifest(args.file, key=load_key(args.key_file))
    except (PackError, OSError) as e:
        return _fail(args.file, e)
    m = info["manifest"]
    if args.json:
        json.dump({"file": args.file, **info}, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
        return 0
    from rich.console import Console
    from rich.table import Table
    model = m["model"]
    summary = Table(title=f"session pack {args.file}", show_header=False)
    summary.add_column("field", style="bold")
    summary.add_column("value")
    layers = model.get("layers") or []
    rows = [
        ("format", f"{m['format']} {m['version']}"),
        ("auth", info["auth"]),
        ("tensor digests", "not checked by inspect (run `muser pack verify`)"),
        ("model", f"{model.get('architecture', '?')}, {len(layers)} layers, kv_heads "
                  f"{model.get('kv_heads', '?')}, head_dim {model.get('head_dim', '?')}" if model else "(none)"),
        ("weights digest", str(model.get("weights_digest", "(none)"))),
        ("encoding", f"{m['encoding']['family']}/{m['encoding']['dtype']}"),
        ("position", f"{m['position']:,}"),
        ("tokens", f"{len(m['tokens']):,} ids" + (f": {m['tokens'][:8]}{' ...' if len(m['tokens']) > 8 else ''}"
                                                  if m["tokens"] else "")),
        ("size", f"{_fmt_bytes(info['file_bytes'])} (header {_fmt_bytes(info['header_bytes'] + 8)}, "
                 f"data {_fmt_bytes(info['data_bytes'])})"),
    ]
    for k, v in rows:
        summary.add_row(k, v)
    planes = Table(title="planes (rows in logical order from `start`; offsets relative to the data section)")
    for col in ("layer", "kind", "window", "start", "count", "offset", "K+V bytes", "sha256 K / V"):
        planes.add_column(col, justify="left" if col in ("kind", "sha256 K / V") else "right", no_wrap=True)
    for p in m["planes"]:
        planes.add_row(str(p["layer"]), p["kind"], str(p["window"] or "-"), f"{p['start']:,}",
                       f"{p['count']:,}", f"{p['keys']['offset']:,}",
                       _fmt_bytes(p["keys"]["length"] + p["values"]["length"]),
                       f"{p['keys']['sha256'][:8]} / {p['values']['sha256'][:8]}")
    console = Console(width=None if sys.stdout.isatty() else 120)
    console.print(summary)
    console.print(planes)
    return 0


def cmd_verify(args) -> int:
    try:
        key = load_key(args.key_file)
        snap, state = pr.verify(args.file, key=key)
    except (PackError, OSError) as e:
        return _fail(args.file, e)
    print(f"{args.file}: OK: {len(snap.planes)} planes at position {snap.position} "
          f"({snap.encoding}), every tensor digest checked; {state}")
    return 0


def cmd_save(args) -> int:
    key = load_key(args.key_file)
    engine = load_engine(args)
    ids = ([int(t) for t in args.ids.split(",")] if args.ids is not None
           else engine.encode_prompt(args.prompt, chat=args.chat))
    session = engine.new_session()
    session.prefill(ids)
    snap = session.snapshot()
    pf.save_pack(snap, args.out, key=key)
    print(f"{args.out}: saved {len(snap.planes)} planes at position {snap.position} ({snap.encoding}), "
          f"{_fmt_bytes(snap.nbytes())} of rows; "
          f"{'signed with HMAC-SHA256' if key else 'unsigned (no key): integrity only'}")
    return 0


def add_pack_commands(subparsers) -> argparse.ArgumentParser:
    """Register `pack inspect | verify | save` on the top-level subparsers; each sets `func`."""
    pack = subparsers.add_parser("pack", help="session packs: inspect | verify | save")
    psub = pack.add_subparsers(dest="pack_command", required=True)
    key_help = "HMAC-SHA256 key file (default: MUSER_PACK_KEY, else integrity only)"

    i = psub.add_parser("inspect", help="show a pack's manifest (header checks only)")
    i.add_argument("file")
    i.add_argument("--json", action="store_true", help="print the manifest and sizes as JSON")
    i.add_argument("--key-file", default=None, help=key_help)
    i.set_defaults(func=cmd_inspect)

    v = psub.add_parser("verify", help="check every digest (and the signature with a key)")
    v.add_argument("file")
    v.add_argument("--key-file", default=None, help=key_help)
    v.set_defaults(func=cmd_verify)

    s = psub.add_parser("save", help="prefill a prompt and save the session as a pack")
    src = s.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="text to tokenize and prefill")
    src.add_argument("--ids", help="comma-separated token ids instead of text")
    s.add_argument("--out", required=True, help="pack file to write (atomically)")
    s.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    s.add_argument("--key-file", default=None, help=key_help)
    model_args(s)
    s.set_defaults(func=cmd_save)
    return pack
