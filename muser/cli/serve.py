"""`muser serve`: flags -> ServerConfig -> engine -> uvicorn.

Owns: the serve subcommand's flags (`add_serve_command(subparsers)`) and its
handler.  Does not own: the top-level parser (cli/main.py) or any serving
logic (muser.server).  Binds 127.0.0.1 unless --host says otherwise.
"""
from __future__ import annotations

import argparse
import logging
import re

from ..env import read as read_env
from ..errors import PackAuthError
from ..pack.manifest import load_key
from ..server.config import ServerConfig
from .args import load_engine, model_args
from .replicas import add_replica_flags, maybe_run_replicas


def add_serve_command(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("serve", help="OpenAI-compatible HTTP server (chat + completions)")
    model_args(p)
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
    p.add_argument("--key-file", "--pack-key-file", dest="key_file", default=None,
                   help="HMAC key file for session packs, read as `muser pack` reads it (or MUSER_PACK_KEY)")
    p.add_argument("--no-batch-decode", action="store_true",
                   help="decode active slots one by one instead of one batched step")
    p.add_argument("--pipeline", choices=["auto", "on", "off"], default="auto",
                   help="greedy decode rounds launch the next step before reading the last: auto "
                        "where the backend pipelines (CUDA; the default), on everywhere, off never")
    p.add_argument("--no-warmup", action="store_true",
                   help="skip the start-up warm-up (CUDA: every decode batch size's first step, "
                        "its kernels compiled and graph captured, before the port opens)")
    p.add_argument("--shift-keep", type=float, default=0.7,
                   help="a context shift keeps at most this fraction of the prompt budget, so the "
                        "next turns extend the cache instead of shifting again (default 0.7)")
    p.add_argument("--prefill-share", type=float, default=0.5,
                   help="most of the worker's time prefill may take while streams decode "
                        "(default 0.5: a long prompt slows running streams about 2x, not 25x)")
    p.add_argument("--prefill-budget", type=int, default=None,
                   help="prompt tokens per prefill round, in whole chunks (default: one chunk)")
    p.add_argument("--stream-interval", type=int, default=1,
                   help="tokens between a stream's chunks: the first token goes out at once, then "
                        "every N-th with the text since (default 1; larger values spend less host "
                        "time a token at high concurrency, as vLLM's option of the same name)")
    p.add_argument("--front-process", nargs="?", const="on", default="auto",
                   choices=["auto", "on", "off"],
                   help="HTTP in a process of its own (sockets, parsing, writing chunks), the app "
                        "and the engine in this one: each has its own GIL, so many streams' writes "
                        "stop taking turns with the GPU's scheduler (as vLLM's API-server split; "
                        "H200, 16 streams: +37%% tok/s). auto (the default): on where the engine "
                        "runs on CUDA; a bare --front-process is on")
    p.add_argument("--header-timeout", type=float, default=10.0,
                   help="seconds a client has to send a request head before the connection is "
                        "closed (default 10)")
    p.add_argument("--max-connections", type=int, default=1024,
                   help="open connections (or running requests) before new ones get 503 (default 1024)")
    p.add_argument("--speculative", default=None, choices=["prompt-lookup"],
                   help="verify prompt-lookup drafts in blocks (greedy output unchanged)")
    p.add_argument("--spec-block", type=int, default=8, help="speculative block size (2..16)")
    p.add_argument("--spec-max-batch", type=int, default=None,
                   help="speculate only while at most this many requests decode (default: any "
                        "number on the CPU int8 path, whose blocks share one forward; else 1)")
    p.add_argument("--prefix-cache-size", type=parse_size, default=None, metavar="BYTES",
                   help="RAM budget of the prefix cache (cut store), e.g. 512MiB or 2GB; "
                        "0 turns it off (default: a tenth of physical memory, at most 8 GiB)")
    p.add_argument("--prefix-cache-dir", default=None,
                   help="disk tier of the prefix cache: session packs that survive a restart "
                        "(sealed with --key-file when given)")
    p.add_argument("--prefix-cache-disk-size", type=parse_size, default=None, metavar="BYTES",
                   help="disk tier budget (default: bounded by the disk; a full disk degrades to RAM)")
    p.add_argument("--prefix-cache-block", type=int, default=64,
                   help="tokens per shared block of the prefix cache (default 64)")
    p.add_argument("--log-level", default="info")
    add_replica_flags(p)
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


def _api_key(args, env) -> str | None:
    """--api-key, else MUSER_API_KEY; given but empty (an unset $KEY) is refused, never 'no auth'
    (muser.env keeps a key variable exactly as set, blank included)."""
    if args.api_key is not None:
        if not args.api_key.strip():
            raise ValueError("--api-key is empty (was it an unset variable?): pass a key, or "
                             "leave the flag out to serve without authentication")
        return args.api_key
    if env.api_key is not None and not env.api_key.strip():
        raise ValueError("MUSER_API_KEY is set but empty: set a key, or unset it to serve "
                         "without authentication")
    return env.api_key


def _pack_key(args, env) -> bytes | None:
    """The pack key, read as `muser pack` reads it (one key file, one key: load_key); an empty or
    blank key -- file or MUSER_PACK_KEY -- is refused at start, not at the first save."""
    where = args.key_file or "MUSER_PACK_KEY"
    if args.key_file is None and env.pack_key is not None and not env.pack_key.strip():
        raise ValueError("MUSER_PACK_KEY is set but empty: set a key, or unset it for "
                         "unsigned packs")
    try:
        key = load_key(args.key_file, env)
    except PackAuthError:
        key = b""
    if key is not None and not key.strip():
        raise ValueError(f"pack key {where} is empty or blank: packs would be signed with no "
                         "secret; write a random key (e.g. `head -c 32 /dev/urandom > key`)")
    return key


def config_from_args(args) -> ServerConfig:
    env = read_env()
    return ServerConfig(
        host=args.host, port=args.port, api_key=_api_key(args, env),
        model_id=args.served_name, slots=args.slots, max_context=args.max_context,
        context_policy=args.context_policy, output_reserve=args.output_reserve, keep=args.keep,
        queue_size=args.queue_size, queue_timeout=args.queue_timeout, session_dir=args.session_dir,
        pack_key=_pack_key(args, env), batch_decode=not args.no_batch_decode, pipeline=args.pipeline,
        warmup=not args.no_warmup, shift_keep=args.shift_keep,
        prefill_share=args.prefill_share, prefill_budget=args.prefill_budget,
        stream_interval=args.stream_interval,
        header_timeout=args.header_timeout, speculative=args.speculative,
        max_connections=args.max_connections,
        spec_block=args.spec_block, spec_max_batch=args.spec_max_batch,
        prefix_cache_bytes=args.prefix_cache_size, prefix_cache_dir=args.prefix_cache_dir,
        prefix_cache_disk_bytes=args.prefix_cache_disk_size, prefix_cache_block=args.prefix_cache_block)


def front_process(choice: str, engine) -> bool:
    """Whether HTTP runs in a front process: `on`, or `auto` with the engine on CUDA (where the
    GPU outruns one GIL shared by the scheduler and the streams; a CPU engine is the bound
    itself, and a small machine's cores are better left to it)."""
    return choice == "on" or (choice == "auto" and str(engine.device).startswith("cuda"))


def cmd_serve(args) -> int:
    import uvicorn

    from ..server.app import create_app
    from ..server.transport import uvicorn_config
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    config = config_from_args(args)            # validate flags before loading weights
    if args.front_process == "on" and getattr(args, "replicas", None) is not None:
        raise ValueError("--front-process and --replicas do not combine: replicas are served "
                         "by Ray Serve's own HTTP proxy")
    rc = maybe_run_replicas(args, config)      # --replicas N: Ray Serve (docs/scale-out.md)
    if rc is not None:
        return rc
    engine = load_engine(args)
    app = create_app(engine, config)
    if front_process(args.front_process, engine):   # HTTP in its own process (bridge.py)
        from ..server.bridge import serve_split
        return serve_split(app, config, args.log_level.lower())
    server = uvicorn.Server(uvicorn_config(app, config, host=config.host, port=config.port,
                                           log_level=args.log_level.lower()))
    try:                                       # as uvicorn.run: Ctrl-C is a clean exit
        server.run()
    except KeyboardInterrupt:
        pass
    return 0 if server.started else 1
