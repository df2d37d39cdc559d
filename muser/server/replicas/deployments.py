"""The Ray Serve deployments, and `serve_app(...)`: the application users deploy.

Owns: `EngineReplica` (one engine + one `ReplicaCore` per Ray actor: loads the
model, serves forwarded requests, publishes routing stats, answers Ray's health
checks -- an unhealthy pool makes Ray replace the replica -- and drains to the
tier in `__del__` when Ray scales it down or shuts it down), `IngressDeployment`
(the FastAPI ingress) and `serve_app`, which binds both with Ray's own
deployment options: num_replicas or an autoscaling config, per-replica
resources (num_gpus, num_cpus), the MuserRouter as the engine deployment's
request router.  Does not own: starting Ray or Serve (cli/replicas.py, or the user's).

    from ray import serve
    import muser
    serve.run(muser.serve_app("gemma3-270m", num_replicas=2), route_prefix="/")
"""
from __future__ import annotations

import asyncio
from typing import Any, Callable

from ray import serve
from ray.serve.config import RequestRouterConfig

from ..config import ServerConfig
from .settings import EngineOptions, ReplicaSpec, RoutingConfig, TierConfig

ENGINE_DEPLOYMENT = "MuserEngine"
INGRESS_DEPLOYMENT = "MuserIngress"


class EngineReplica:
    async def __init__(self, spec: ReplicaSpec):
        import torch
        if spec.threads is not None:
            torch.set_num_threads(spec.threads)
        from .core import ReplicaCore
        name = serve.get_replica_context().replica_tag
        engine = await asyncio.to_thread(spec.load_engine)
        self.core = ReplicaCore(engine, spec, name)
        await self.core.start()

    async def serve_request(self, fwd):
        async for item in self.core.handle(fwd):
            yield item

    async def replica_status(self, metrics: bool = True) -> dict:
        return self.core.status(metrics)

    async def record_routing_stats(self) -> dict:
        return self.core.routing_stats()

    async def check_health(self) -> None:
        self.core.check_health()

    async def __del__(self):
        core = getattr(self, "core", None)
        if core is not None:
            await core.stop()


class IngressDeployment:
    def __init__(self, engine_handle, spec: ReplicaSpec):
        from .ingress import Ingress
        self.ingress = Ingress(engine_handle, spec)

    def __serve_build_asgi_app__(self):
        from .ingress import build_app
        return build_app(self.ingress)


def serve_app(model: str = "gemma3-270m", *, server: ServerConfig | None = None,
              engine: EngineOptions | None = None, routing: RoutingConfig | None = None,
              tier: TierConfig | None = None, num_replicas: int | str | None = 1,
              autoscaling_config: dict | None = None, num_gpus: float = 0,
              num_cpus: float = 1, threads: int | None = None,
              engine_factory: Callable[[EngineOptions], Any] | None = None,
              ray_actor_options: dict | None = None, ingress_replicas: int = 1,
              graceful_shutdown_timeout_s: float = 60.0):
    """The Ray Serve application: an ingress and `num_replicas` engine replicas.

    model / engine: what each replica loads (`engine` wins when given; its
    `model` field is then the model).  server: the per-replica ServerConfig
    (slots, context policy, queue, api_key, served name, ...).  routing /
    tier: RoutingConfig and TierConfig (`TierConfig(dir=...)` makes sessions
    survive their replica).  num_replicas, autoscaling_config (Ray Serve's
    dict: min_replicas, max_replicas, target_ongoing_requests, ...; then
    num_replicas must be None or "auto"), num_gpus / num_cpus per replica and
    ray_actor_options go to Ray as they are.  threads: torch threads per
    replica (default: what Ray's num_cpus implies).  engine_factory: a
    picklable callable(EngineOptions) -> Engine for custom loading.
    """
    engine = engine or EngineOptions(model=model)
    server = server or ServerConfig()
    spec = ReplicaSpec(engine, server, routing or RoutingConfig(), tier or TierConfig(),
                       engine_factory, threads)
    if autoscaling_config is not None and num_replicas not in (None, "auto"):
        raise ValueError("with autoscaling_config, num_replicas must be None or 'auto', "
                         f"got {num_replicas!r}")
    actor = dict(ray_actor_options or {})
    actor.setdefault("num_cpus", num_cpus)
    if num_gpus:
        actor.setdefault("num_gpus", num_gpus)
    router = RequestRouterConfig(
        request_router_class="muser.server.replicas.router.MuserRouter",
        request_router_kwargs={"imbalance": spec.imbalance},
        request_routing_stats_period_s=spec.routing.stats_period_s,
        request_routing_stats_timeout_s=max(5.0, 5 * spec.routing.stats_period_s))
    options: dict[str, Any] = dict(
        name=ENGINE_DEPLOYMENT, ray_actor_options=actor,
        max_ongoing_requests=server.slots + max(1, server.queue_size),
        request_router_config=router, health_check_period_s=5.0,
        graceful_shutdown_timeout_s=graceful_shutdown_timeout_s)
    if autoscaling_config is not None:
        options["autoscaling_config"] = autoscaling_config
        if num_replicas == "auto":
            options["num_replicas"] = "auto"
    else:
        options["num_replicas"] = num_replicas
    engine_dep = serve.deployment(EngineReplica).options(**options)
    ingress_dep = serve.deployment(serve.ingress()(IngressDeployment)).options(
        name=INGRESS_DEPLOYMENT, num_replicas=ingress_replicas, max_ongoing_requests=4096,
        ray_actor_options={"num_cpus": 0})
    return ingress_dep.bind(engine_dep.bind(spec), spec)

