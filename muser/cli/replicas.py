"""`muser serve --replicas N`: the same server through Ray Serve, N engine replicas.

Owns: the replica flags (`add_replica_flags(parser)`, added to `muser serve`)
and `run_replicas(args)`: validate every flag before Ray starts, start a local
Ray cluster (or join `--ray-address`), start Serve's HTTP proxy on
--host/--port, deploy `serve_app(...)`, wait until interrupted, and shut down
what it started (a joined cluster only loses this application).
Does not own: the single-process flags (cli/serve.py) or the deployments
(muser.server.replicas).
"""
from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import signal
import threading

log = logging.getLogger("muser.replicas")
APP_NAME = "muser"


def add_replica_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("replicas (Ray Serve; pip install 'muser[ray]')")
    g.add_argument("--replicas", type=int, default=None,
                   help="serve through Ray Serve with N engine replicas behind one endpoint")
    g.add_argument("--max-replicas", type=int, default=None,
                   help="autoscale between --replicas and this many replicas")
    g.add_argument("--ray-address", default=None,
                   help="join this Ray cluster (e.g. auto or ray://host:10001) instead of "
                        "starting a local one")
    if "--prefix-cache-dir" not in p._option_string_actions:   # the prefix store may own it
        g.add_argument("--prefix-cache-dir", default=None,
                       help="shared cut tier: a directory every replica can read and write; "
                            "a conversation then survives its replica")
        p.set_defaults(replica_owned_flags=("prefix_cache_dir",))
    g.add_argument("--num-gpus", type=float, default=0.0, help="GPUs per replica (default 0)")
    g.add_argument("--num-cpus", type=float, default=1.0, help="CPUs per replica (default 1)")
    g.add_argument("--route-block", type=int, default=64,
                   help="tokens per prefix-routing block (default 64)")
    g.add_argument("--object-store-mb", type=int, default=512,
                   help="local cluster only: Ray object store size in MiB (default 512)")


REPLICA_ONLY = ("max_replicas", "ray_address")


def maybe_run_replicas(args, config) -> int | None:
    """Run the replicated server when --replicas is given; None otherwise (single process).
    Replica-only flags without --replicas are refused rather than ignored."""
    if getattr(args, "replicas", None) is not None:
        return run_replicas(args, config)
    given = [f for f in REPLICA_ONLY + tuple(getattr(args, "replica_owned_flags", ()))
             if getattr(args, f, None) is not None]
    if given:
        flags = ", ".join("--" + f.replace("_", "-") for f in given)
        raise ValueError(f"{flags} only apply with --replicas N")
    return None


def replica_app_from_args(args, config):
    """(the Ray Serve application, number of replicas) from parsed flags."""
    from ..server.replicas import serve_app
    from ..server.replicas.settings import EngineOptions, RoutingConfig, TierConfig
    n = args.replicas
    if n < 1:
        raise ValueError(f"--replicas must be >= 1, got {n}")
    if args.max_replicas is not None and args.max_replicas < n:
        raise ValueError(f"--max-replicas ({args.max_replicas}) must be >= --replicas ({n})")
    if args.num_gpus < 0 or args.num_cpus < 0:
        raise ValueError("--num-gpus and --num-cpus must be >= 0")
    engine = EngineOptions(model=args.model, device=args.device, dtype=args.dtype,
                           backend=args.backend, quant=args.quant, max_context=args.max_context,
                           chunk_size=getattr(args, "chunk_size", None))
    tier = TierConfig(dir=getattr(args, "prefix_cache_dir", None), pack_key=config.pack_key)
    routing = RoutingConfig(block_tokens=args.route_block)
    autoscaling = None
    num_replicas: int | str | None = n
    if args.max_replicas is not None and args.max_replicas > n:
        autoscaling = {"min_replicas": n, "max_replicas": args.max_replicas,
                       "target_ongoing_requests": config.slots}
        num_replicas = None
    threads = max(1, int(args.num_cpus)) if args.num_cpus >= 1 else 1
    app = serve_app(engine=engine, server=config, routing=routing, tier=tier,
                    num_replicas=num_replicas, autoscaling_config=autoscaling,
                    num_gpus=args.num_gpus, num_cpus=args.num_cpus, threads=threads)
    return app, n


def run_replicas(args, config) -> int:
    # Ray is an optional extra: say how to get it rather than fail on an import.
    if importlib.util.find_spec("ray") is None or importlib.util.find_spec("ray.serve") is None:
        raise ValueError("--replicas needs Ray Serve: pip install 'muser[ray]'")
    import ray
    from ray import serve
    app, n = replica_app_from_args(args, config)     # every flag checked before Ray starts
    if args.ray_address:
        ray.init(address=args.ray_address, logging_level=logging.WARNING)
    else:
        cpus = max(os.cpu_count() or 1, int(n * max(args.num_cpus, 0)) + 1)
        ray.init(num_cpus=cpus, include_dashboard=False, logging_level=logging.WARNING,
                 object_store_memory=args.object_store_mb << 20)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": config.host, "port": config.port})
        serve.run(app, name=APP_NAME, route_prefix="/")
        print(f"muser: serving {args.model} on http://{config.host}:{config.port} through Ray "
              f"Serve, {n} replica(s){' (autoscaling to ' + str(args.max_replicas) + ')' if args.max_replicas else ''}"
              f"; Ctrl-C stops", flush=True)
        stop.wait()
    finally:
        if args.ray_address:
            serve.delete(APP_NAME)                  # a joined cluster keeps its other apps
        else:
            serve.shutdown()
        ray.shutdown()
    return 0
