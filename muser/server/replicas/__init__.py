"""muser.server.replicas: the OpenAI server past one process, on Ray Serve.

    client -> Ray Serve proxy -> Ingress (FastAPI: auth, routing keys, retry)
           -> MuserRouter (Ray Serve RequestRouter: session, prefix, queue length)
           -> EngineReplica x N (each: one muser.server app -- slots, staging, policy)
           <-> shared cut tier (--prefix-cache-dir: a conversation outlives its replica)

Package map (each module's docstring says what it owns and what it doesn't):
  settings.py   frozen config: EngineOptions, RoutingConfig, TierConfig, ReplicaSpec
  keys.py       routing keys: chained hashes of token-id blocks, hashed session ids (pure)
  routing.py    the routing policy as a pure function over replica views (no Ray)
  router.py     MuserRouter: that policy plugged into Ray Serve's RequestRouter
  wire.py       Forwarded: one HTTP request as it travels from the ingress to a replica
  bridge.py     driving an ASGI app in-process with a Forwarded request
  tier.py       PackDirTier: conversation cuts in a shared directory (session packs)
  core.py       ReplicaCore: one engine + one server app + the tier, with no Ray in it
  promtext.py   merging the replicas' Prometheus texts (per replica and summed)
  ingress.py    the ingress FastAPI app (forwarding, retries, /health, /metrics)
  deployments.py  the Ray Serve deployments and `serve_app(...)`
(`muser serve --replicas N` -- flags, starting or joining Ray -- is muser/cli/replicas.py, registered by muser/cli/serve.py.)

Importing this package imports neither Ray nor torch: `from muser.server.replicas import serve_app`
loads Ray only when called.
"""
from __future__ import annotations


def serve_app(*args, **kwargs):
    """Build the Ray Serve application (see deployments.serve_app for the arguments)."""
    from .deployments import serve_app as build
    return build(*args, **kwargs)


__all__ = ["serve_app"]
