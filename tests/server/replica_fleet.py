"""A local Ray cluster serving the tiny model through muser's replicas, for black-box tests.

`start_fleet(...)` starts Ray (bounded for a 2-core CI box: a small object
store, no dashboard), Serve's HTTP proxy on a free loopback port and the
replicated app; `Fleet.stop()` tears all of it down.  `paced_engine` is the
engine factory the tests deploy: the real tiny engine whose decode steps each
take at least `delay` seconds, so a test can kill a replica while a
generation is provably in flight (the arithmetic is untouched).
"""
from __future__ import annotations

import functools
import socket
import time
from dataclasses import dataclass

import httpx

APP = "muser-test"


def paced_engine(options, delay: float):
    from muser.engine.session import Session
    engine = options.load()

    class PacedSession(Session):
        def decode(self, token_id):
            time.sleep(delay)
            return super().decode(token_id)

    batch = engine.decode_batch

    def decode_batch(sessions, tokens):
        time.sleep(delay)
        return batch(sessions, tokens)

    engine.new_session = lambda: PacedSession(engine)
    engine.decode_batch = decode_batch
    return engine


@dataclass
class Fleet:
    port: int
    key: str
    model_dir: str = ""
    tier_dir: str = ""

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, **kw):
        import openai
        return openai.OpenAI(base_url=self.base + "/v1", api_key=self.key, max_retries=0,
                             timeout=kw.pop("timeout", 60), **kw)

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.base, timeout=60)

    def replicas(self) -> list[dict]:
        with self.http() as h:
            r = h.get("/v1/replicas", headers={"authorization": f"Bearer {self.key}"})
            r.raise_for_status()
            return r.json()["data"]

    def kill(self, replica: str) -> None:
        """Kill one engine replica's actor the way a crash would (no graceful drain)."""
        import ray
        actor = ray.get_actor(f"SERVE_REPLICA::{APP}#MuserEngine#{replica}", namespace="serve")
        ray.kill(actor, no_restart=True)

    def stop(self) -> None:
        import ray
        from ray import serve
        try:
            serve.shutdown()
        finally:
            ray.shutdown()


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def deploy(model_dir: str, tier_dir: str, key: str, delay: float = 0.02, replicas: int = 2,
           save: str = "turns") -> None:
    """(Re)deploy the replicated app on the running cluster; returns once it is serving."""
    from ray import serve

    from muser.server.config import ServerConfig
    from muser.server.replicas import serve_app
    from muser.server.replicas.settings import EngineOptions, RoutingConfig, TierConfig
    app = serve_app(engine=EngineOptions(model_dir),
                    server=ServerConfig(model_id="tiny", slots=2, output_reserve=32, api_key=key),
                    routing=RoutingConfig(block_tokens=8, stats_period_s=0.5, route_timeout_s=30),
                    tier=TierConfig(dir=tier_dir, save=save), num_replicas=replicas, num_cpus=1,
                    threads=1, engine_factory=functools.partial(paced_engine, delay=delay),
                    graceful_shutdown_timeout_s=10)
    serve.run(app, name=APP, route_prefix="/")


def start_fleet(model_dir: str, tier_dir: str, key: str, delay: float = 0.02) -> Fleet:
    """Raises whatever Ray raises when it cannot start (the caller skips on that)."""
    import sys

    import ray
    from ray import cloudpickle, serve
    ray.init(num_cpus=2, object_store_memory=96 << 20, include_dashboard=False,
             log_to_driver=False, configure_logging=False)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])   # workers cannot import tests/
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    deploy(model_dir, tier_dir, key, delay)
    return Fleet(port, key, model_dir, tier_dir)
