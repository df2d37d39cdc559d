"""The engine: one loaded model, its run settings, and sessions over it.

Owns: `Engine` (weights on a device, the tokenizer, the cut encoding, the
model fingerprint, `new_session`, `restore`, `generate`, `decode_batch`).
Does not own: reading weight files (muser.model, engine/loader.py), the
per-session cache (session.py), speculation (speculative.py).
"""
from __future__ import annotations

from typing import Iterable, Iterator

import torch

from ..cache import Encoding, SessionSnapshot
from ..config import EngineConfig, ModelSpec
from ..errors import RequestError, TokenizerUnavailable
from ..attention import select_attention
from .sampling import SamplingParams
from .session import Session

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class Engine:
    def __init__(self, name: str, spec: ModelSpec, weights, tokenizer, config: EngineConfig,
                 weights_digest: str):
        if config.dtype not in DTYPES:
            raise RequestError(f"dtype must be one of {sorted(DTYPES)}, got {config.dtype!r}")
        if config.backend not in ("ring", "oracle"):
            raise RequestError(f"backend must be 'ring' or 'oracle', got {config.backend!r}")
        if config.backend == "oracle" and (config.dtype != "float32" or config.device != "cpu"):
            raise RequestError("the oracle backend is float32 on the CPU by definition, got "
                               f"{config.dtype} on {config.device}")
        self.name = name
        self.spec = spec
        self.config = config
        self.device = torch.device(config.device)
        self.dtype = DTYPES[config.dtype]
        self.cache_dtype = self.dtype
        self.weights = weights
        self._tokenizer = tokenizer
        self.max_context = min(config.max_context or spec.max_context, spec.max_context)
        # int8 weights compute different K/V bits than float weights: a distinct encoding.
        # (the family names the weight path; the dtype is the rows' dtype on the wire)
        self.encoding = Encoding(config.backend if config.quant == "none"
                                 else f"{config.backend}+{config.quant}", config.dtype)
        self.attention = select_attention(self.device)
        self.cuda_graphs = self.device.type == "cuda"   # decode through engine/cuda_graph.py
        self._runner = None
        self.fingerprint = {
            "architecture": spec.architecture,
            "layers": [[l.kind, l.window, l.rope] for l in spec.layers],
            "kv_heads": spec.num_kv_heads,
            "head_dim": spec.head_dim,
            "weights_digest": weights_digest,
        }

    # ------------------------------------------------------------------ basics
    @property
    def tokenizer(self):
        if self._tokenizer is None:
            raise TokenizerUnavailable(f"model {self.name!r} was loaded without tokenizer files; "
                                       "use token ids (prefill/decode) or add tokenizer.json")
        return self._tokenizer

    @property
    def has_tokenizer(self) -> bool:
        return self._tokenizer is not None

    def new_session(self) -> Session:
        return Session(self)

    def check_snapshot_model(self, snap: SessionSnapshot) -> None:
        """Refuse a cut made by another model (when the cut names its model)."""
        if snap.model:
            from ..pack.manifest import check_model
            check_model(snap, self.fingerprint)

    @property
    def store(self):
        """This engine's cut store (muser.store.CutStore): created on first use with a RAM tier of
        the default size; assign a configured `CutStore(engine, ...)` (or None) to replace it."""
        if getattr(self, "_store", None) is None:
            from ..store import CutStore
            self._store = CutStore(self)
        return self._store

    @store.setter
    def store(self, value) -> None:
        self._store = value

    def restore(self, snap: SessionSnapshot, into: Session | None = None) -> Session:
        s = into if into is not None else self.new_session()
        s.install(snap)
        return s

    def decode_batch(self, sessions: list[Session], tokens: list[int]) -> torch.Tensor:
        """One decode step for several sessions: float32 logits [B, vocab]."""
        if len(sessions) != len(tokens):
            raise RequestError(f"decode_batch got {len(sessions)} sessions and {len(tokens)} tokens")
        runner = self.decode_runner()
        if runner is not None and sessions:
            return runner.decode(sessions, tokens)     # one batched graph replay
        if len(sessions) > 1 and self.row_invariant:
            from .batch import decode_batch
            return decode_batch(self, sessions, tokens)   # shared matmuls, bitwise = alone
        return torch.stack([s.decode(t) for s, t in zip(sessions, tokens)])

    @property
    def row_invariant(self) -> bool:
        """Whether a row of a batched matmul equals the one-row matmul bit for bit
        (the int8 CPU kernel: measured, benchmarks/NOTES.md)."""
        return self.config.quant == "int8"

    def compact_chunk(self, padded_rows: int) -> bool:
        """Whether a chunk padded to `padded_rows` may run everything but attention on its real
        rows only: true when every row-wise op takes the row-invariant int8 kernels (few rows;
        more than DENSE_ROWS take the dense bf16 copy, which is not row-invariant)."""
        from ..model.quantize import DENSE_ROWS
        return self.row_invariant and padded_rows <= DENSE_ROWS

    def decode_runner(self):
        """The CUDA graph runner for decode steps, or None (CPU, oracle, or turned off)."""
        if not self.cuda_graphs:
            return None
        if self._runner is None:
            from .cuda_graph import make_runner
            self._runner = make_runner(self) or False
        return self._runner or None

    # ------------------------------------------------------------------ text
    def encode_prompt(self, prompt: str | list[int], chat: bool = False) -> list[int]:
        if isinstance(prompt, str):
            if chat:
                return self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
            return self.tokenizer.encode(prompt)
        return [int(i) for i in prompt]

    def stream(self, prompt: str | list[int], max_tokens: int = 128, temperature: float = 0.0,
               top_p: float = 1.0, top_k: int = 0, seed: int | None = None,
               session: Session | None = None, chat: bool = False,
               speculative: str | None = None, block: int | None = None,
               stats: dict | None = None) -> Iterator[int]:
        """Yield generated token ids (stops at an end-of-sequence id, not yielded)."""
        from .generate import generate_ids
        params = SamplingParams(temperature, top_p, top_k, seed)
        if max_tokens < 0:
            raise RequestError(f"max_tokens must be >= 0, got {max_tokens}")
        ids = self.encode_prompt(prompt, chat)
        s = session if session is not None else self.new_session()
        return generate_ids(self, s, ids, max_tokens, params, speculative=speculative,
                            block=block, stats=stats)

    def generate(self, prompt: str | list[int], max_tokens: int = 128, temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, seed: int | None = None,
                 stop: Iterable[str] | str | None = None, **kw) -> str:
        """Generate text; stops at end-of-sequence, `max_tokens` or the first `stop` string."""
        from .generate import stream_text
        return "".join(stream_text(self, self.stream(prompt, max_tokens, temperature, top_p,
                                                     top_k, seed, **kw), stop))
