"""`ServerConfig`: every setting of `muser serve`, frozen and validated.

Owns: the server's knobs and their defaults.  Does not own: the engine's
settings (muser.config.EngineConfig) or parsing flags (cli/serve.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    model_id: str | None = None             # served id; None -> the name the engine was loaded by
    slots: int = 4
    max_context: int | None = None          # None -> the engine's max_context
    context_policy: Literal["shift", "error"] = "shift"
    output_reserve: int | None = None       # None -> min(256, max_context // 4)
    keep: int = 0                           # completions: raw prefix kept by a shift (after BOS)
    queue_size: int = 64                    # requests waiting for a slot before 429
    queue_timeout: float = 60.0             # seconds a request may wait before 429
    session_dir: str | None = None          # enables /v1/slots/{id}/save and /restore
    pack_key: bytes | None = None           # HMAC key for session packs
    max_body_bytes: int = 8 << 20           # generation bodies; counted as they arrive (chunked too)
    max_slot_body_bytes: int = 4 << 10      # save / restore bodies ({"filename": ...})
    max_messages: int = 4096                # chat messages per request (planning renders them)
    body_timeout: float = 60.0              # seconds to receive a whole body before 408
    header_timeout: float = 10.0            # seconds to send a request head before the close
    max_header_bytes: int = 64 << 10        # request line + headers before the close
    max_connections: int = 1024             # open connections (or requests) before 503s
    batch_decode: bool = True               # one engine.decode_batch step for all active slots
    pipeline: Literal["auto", "on", "off"] = "auto"   # greedy rounds one step ahead (pipeline.py):
                                            # auto where the backend pipelines (CUDA), on also
                                            # elsewhere (one step at a time underneath), off never
    warmup: bool = True                     # every batch size's first step before the port
                                            # opens (engine/warmup.py; CUDA only)
    shift_keep: float = 0.7                 # a shift keeps at most this fraction of the budget
    prefill_share: float = 0.5              # worker time prefill may take while streams decode
    prefill_budget: int | None = None       # prompt tokens per prefill round (None: chunk_size)
    stream_interval: int = 1                # a choice's text goes out every this many tokens
                                            # (the first, and the last, at once: vLLM's
                                            # --stream-interval); fewer, larger chunks
    speculative: str | None = None          # "prompt-lookup": verify drafted blocks (speculation.py)
    spec_block: int = 8                     # tokens per verification block (1 + drafts), <= 16
    spec_max_batch: int | None = None       # speculate only in rounds with at most this many
                                            # decoding choices (vLLM's speculative_disable_by_
                                            # batch_size; None: any number where the engine
                                            # verifies them in one forward, else 1)
    prefix_cache_bytes: int | None = None   # RAM tier of the cut store; None -> a tenth of RAM; 0 = off
    prefix_cache_dir: str | None = None     # disk tier (session packs, sealed with pack_key)
    prefix_cache_disk_bytes: int | None = None   # disk tier budget; None -> bounded by the disk
    prefix_cache_block: int = 64            # tokens per shared block (and the rounding of cuts)
    replica: str | None = None              # names this server in each response's muser object
                                            # (set per replica by muser.server.replicas)

    def __post_init__(self):
        if not 1 <= self.slots <= 256:
            raise ValueError(f"slots must be in [1, 256], got {self.slots}")
        if self.context_policy not in ("shift", "error"):
            raise ValueError(f"context policy must be shift or error, got {self.context_policy!r}")
        if self.max_context is not None and self.max_context < 2:
            raise ValueError(f"max_context must be >= 2, got {self.max_context}")
        if self.output_reserve is not None and self.output_reserve < 0:
            raise ValueError(f"output_reserve must be >= 0, got {self.output_reserve}")
        if self.keep < 0:
            raise ValueError(f"keep must be >= 0, got {self.keep}")
        if self.queue_size < 0 or self.queue_timeout <= 0:
            raise ValueError("queue_size must be >= 0 and queue_timeout > 0")
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in [1, 65535], got {self.port}")
        if self.speculative not in (None, "prompt-lookup"):
            raise ValueError(f"speculative must be prompt-lookup or off, got {self.speculative!r}")
        if not 2 <= self.spec_block <= 16:
            raise ValueError(f"spec_block must be in [2, 16], got {self.spec_block}")
        if self.spec_max_batch is not None and self.spec_max_batch < 1:
            raise ValueError(f"spec_max_batch must be >= 1, got {self.spec_max_batch}")
        if (self.prefix_cache_bytes is not None and self.prefix_cache_bytes < 0) or \
                (self.prefix_cache_disk_bytes is not None and self.prefix_cache_disk_bytes < 0):
            raise ValueError("prefix cache sizes must be >= 0 bytes")
        if not 1 <= self.prefix_cache_block <= 4096:
            raise ValueError(f"prefix cache block must be in [1, 4096] tokens, got {self.prefix_cache_block}")
        if self.prefix_cache_dir is not None and self.prefix_cache_bytes == 0:
            raise ValueError("--prefix-cache-dir needs the prefix cache on (a size above 0)")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("api_key must not be empty (leave it unset to disable auth)")
        if self.pack_key is not None and not bytes(self.pack_key).strip():
            raise ValueError("pack_key must not be empty or blank (leave it unset for unsigned packs)")
        if not 0.0 < self.shift_keep <= 1.0:
            raise ValueError(f"shift_keep must be in (0, 1], got {self.shift_keep}")
        if not 0.0 < self.prefill_share <= 1.0:
            raise ValueError(f"prefill_share must be in (0, 1], got {self.prefill_share}")
        if not 1 <= self.stream_interval <= 4096:
            raise ValueError(f"stream_interval must be in [1, 4096] tokens, got {self.stream_interval}")
        if self.prefill_budget is not None and self.prefill_budget < 1:
            raise ValueError(f"prefill_budget must be >= 1, got {self.prefill_budget}")
        for name in ("max_body_bytes", "max_slot_body_bytes", "max_header_bytes", "max_messages",
                     "max_connections"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.body_timeout <= 0 or self.header_timeout <= 0:
            raise ValueError("body_timeout and header_timeout must be > 0")

    def effective_max_context(self, engine_max: int) -> int:
        return min(self.max_context or engine_max, engine_max)

    def effective_reserve(self, max_context: int) -> int:
        r = self.output_reserve if self.output_reserve is not None else min(256, max_context // 4)
        if r >= max_context:
            raise ValueError(f"output_reserve ({r}) must be below max_context ({max_context})")
        return r
