"""Frozen configuration of a replicated deployment, passed explicitly to every process.

Owns: `EngineOptions` (how each replica loads its engine), `RoutingConfig`
(routing-key block size, imbalance bound, stats period, retries, routing
timeout), `TierConfig` (the shared cut directory) and `ReplicaSpec` (all of
it plus the per-replica `ServerConfig`).  Every value is validated here, in
the driver, before Ray starts anything.  Does not own: Ray's own deployment
options (num_replicas, autoscaling, resources: deployments.serve_app) or the
single-process server's knobs (muser.server.config.ServerConfig).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..config import ServerConfig


@dataclass(frozen=True)
class EngineOptions:
    """What `muser.load` gets in every replica (None: the device's default)."""

    model: str = "gemma3-270m"
    device: str = "cpu"
    dtype: str | None = None
    backend: str = "ring"
    quant: str | None = None
    max_context: int | None = None
    chunk_size: int | None = None

    def load(self):
        from ...engine.loader import load
        return load(self.model, device=self.device, dtype=self.dtype, backend=self.backend,
                    max_context=self.max_context, quant=self.quant, chunk_size=self.chunk_size,
                    progress=False)


@dataclass(frozen=True)
class RoutingConfig:
    block_tokens: int = 64          # tokens per routing-key block (the prefix granularity)
    imbalance: int | None = None    # queue-length lead that overrides affinity; None: 2 x slots
    stats_period_s: float = 1.0     # how often replicas publish their keys (Ray routing stats)
    retries: int = 2                # re-sends of a request whose replica died before any byte
    route_timeout_s: float = 60.0   # wait for a replica to accept a request before a 503
    session_header: str = "x-session-id"

    def __post_init__(self):
        if not 1 <= self.block_tokens <= 4096:
            raise ValueError(f"block_tokens must be in [1, 4096], got {self.block_tokens}")
        if self.imbalance is not None and self.imbalance < 0:
            raise ValueError(f"imbalance must be >= 0, got {self.imbalance}")
        if not 0.05 <= self.stats_period_s <= 600:
            raise ValueError(f"stats_period_s must be in [0.05, 600], got {self.stats_period_s}")
        if not 0 <= self.retries <= 10:
            raise ValueError(f"retries must be in [0, 10], got {self.retries}")
        if self.route_timeout_s <= 0:
            raise ValueError(f"route_timeout_s must be > 0, got {self.route_timeout_s}")
        if not self.session_header or self.session_header != self.session_header.lower():
            raise ValueError("session_header must be a non-empty lower-case header name, "
                             f"got {self.session_header!r}")


@dataclass(frozen=True)
class TierConfig:
    """The shared cut tier: a directory every replica can read and write."""

    dir: str | None = None          # None: no tier (a dead replica's sessions re-prefill)
    pack_key: bytes | None = None   # HMAC key for the packs (as --pack-key-file)
    max_bytes: int = 8 << 30        # oldest cuts are removed past this
    save: str = "turns"             # "turns": every turn end; "drain": only when a replica stops

    def __post_init__(self):
        if self.save not in ("turns", "drain"):
            raise ValueError(f"tier save must be 'turns' or 'drain', got {self.save!r}")
        if self.max_bytes < 1 << 20:
            raise ValueError(f"tier max_bytes must be >= 1 MiB, got {self.max_bytes}")


@dataclass(frozen=True)
class ReplicaSpec:
    """Everything one engine replica needs; pickled to each replica by Ray."""

    engine: EngineOptions = field(default_factory=EngineOptions)
    server: ServerConfig = field(default_factory=ServerConfig)
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    tier: TierConfig = field(default_factory=TierConfig)
    # A picklable callable(EngineOptions) -> Engine, for custom loading; None: EngineOptions.load.
    engine_factory: Callable[[EngineOptions], Any] | None = None
    threads: int | None = None      # torch threads per replica; None: what Ray's num_cpus implies

    def __post_init__(self):
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")

    @property
    def imbalance(self) -> int:
        r = self.routing.imbalance
        return 2 * self.server.slots if r is None else r

    def load_engine(self):
        if self.engine_factory is not None:
            return self.engine_factory(self.engine)
        return self.engine.load()
