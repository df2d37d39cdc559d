"""`muser serve`: flags -> ServerConfig -> engine -> uvicorn.

Owns: the serve subcommand's flags (`add_serve_command(subparsers)`) and its
handler.  Does not own: the top-level parser (muser/cli.py) or any serving
logic (app.py).  Binds 127.0.0.1 unless --host says otherwise.
"""
from __future__ import annotations

import argparse
import logging
import os
import re

from .config import ServerConfig


def add_serve_command(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("serve", help="OpenAI-compatible HTTP server (chat + completions)")
    try:
        from ..cli import _model_args
        _model_args(p)
    except ImportError:                     # the lead's parser helpers are optional here
        p.add_argument("--model", default="gemma3-270m")
        p.add_argument("--device", default="cpu")
        p.add_argument("--dtype", default=None)
        p.add_argument("--backend", default="ring", choices=["ring", "oracle"])
        p.add_argument("--quant", default=None)
        p.add_argument("--max-context", type=int, default=None)
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on /v1 (or MUSER_API_KEY)")
    p.add_argument("--served-name", default=None,
                   help="model id clients must name (default: the name the model was loaded by)")
    p.add_argument("--slots", type=int, default=4, help="serving sessions (default 4)")
    p.add_argument("--context-policy", default="shift", choices=["shift", "error"])
    p.add_argument("--output-reserve", type=int, default=None,
                   help="tokens kept free for the reply when planning a shift "
                        "(default min(256, max_context/4))")
    p.add_argument("--keep", type=int, default=0,
                   help="completions: prompt tokens after BOS that a shift always keeps")
    p.add_argument("--queue-size", type=int, default=64, help="waiting requests before 429")
    p.add_argument("--queue-timeout", type=float, default=60.0, help="seconds waiting before 429")
    p.add_argument("--session-dir", default=None, help="enables /v1/slots/{id}/save and /restore")
    p.add_argument("--pack-key-file", default=None, help="HMAC key for session packs (or MUSER_PACK_KEY)")
    p.add_argument("--prefix-cache-size", type=parse_size, default=None, metavar="BYTES",
                   help="RAM budget of the prefix cache (cut store), e.g. 512MiB or 2GB; "
                        "0 turns it off (default: a tenth of physical memory, at most 8 GiB)")
    p.add_argument("--prefix-cache-dir", default=None,
                   help="disk tier of the prefix cache: session packs that survive a restart "
                        "(sealed with --pack-key-file when given)")
    p.add_argument("--prefix-cache-disk-size", type=parse_size, default=None, metavar="BYTES",
                   help="disk tier budget (default: bounded by the disk; a full disk degrades to RAM)")
    p.add_argument("--prefix-cache-block", type=int, default=64,
                   help="tokens per shared block of the prefix cache (default 64)")
    p.add_argument("--no-batch-decode", action="store_true",
                   help="decode active slots one by one instead of one batched step")
    p.add_argument("--log-level", default="info")
    p.set_defaults(func=cmd_serve)
    return p


_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1 << 10, "m": 1000 ** 2, "mb": 1000 ** 2,
          "mib": 1 << 20, "g": 1000 ** 3, "gb": 1000 ** 3, "gib": 1 << 30, "t": 1000 ** 4,
          "tb": 1000 ** 4, "tib": 1 << 40}


def parse_size(text: str) -> int:
    """'0', '65536', '64MiB', '1.5GB' -> bytes (argparse type)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(text))
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"expected a size like 0, 65536, 512MiB or 2GB, got {text!r}")
    return int(float(m.group(1)) * _UNITS[unit])


def config_from_args(args) -> ServerConfig:
    key = None
    if args.pack_key_file:
        with open(args.pack_key_file, "rb") as f:
            key = f.read().strip()
    elif os.environ.get("MUSER_PACK_KEY"):
        key = os.environ["MUSER_PACK_KEY"].encode()
    return ServerConfig(
        host=args.host, port=args.port, api_key=args.api_key or os.environ.get("MUSER_API_KEY") or None,
        model_id=args.served_name, slots=args.slots, max_context=args.max_context,
        context_policy=args.context_policy, output_reserve=args.output_reserve, keep=args.keep,
        queue_size=args.queue_size, queue_timeout=args.queue_timeout, session_dir=args.session_dir,
        pack_key=key, batch_decode=not args.no_batch_decode,
        prefix_cache_bytes=args.prefix_cache_size, prefix_cache_dir=args.prefix_cache_dir,
        prefix_cache_disk_bytes=args.prefix_cache_disk_size, prefix_cache_block=args.prefix_cache_block)


def cmd_serve(args) -> int:
    import uvicorn

    from .app import create_app
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    config = config_from_args(args)            # validate flags before loading weights
    from ..cli import load_engine
    engine = load_engine(args)
    app = create_app(engine, config)
    uvicorn.run(app, host=config.host, port=config.port, log_level=args.log_level.lower(),
                timeout_graceful_shutdown=5)
    return 0
