"""The engine: one loaded model, its run settings, and sessions over it.

Owns: `Engine` (weights on a device, the tokenizer, the cut encoding, the
model fingerprint, the backend chosen once for its device, `forward` -- the one
entry of every step: 1..B sessions x 1..k rows, validated --, `new_session`,
`restore`, `generate`, `decode_batch`).  Does not own: reading weight files
(muser.model, engine/loader.py), the per-session cache (session.py), the step
itself (the backend's driver, muser.backends), speculation (speculative.py).
"""
from __future__ import annotations

from typing import Iterable, Iterator

import torch

from ..backends import select
from ..cache import Encoding, SessionSnapshot
from ..config import HEAD_ONLY, EngineConfig, ModelSpec
from ..env import Env, read as read_env
from ..errors import RequestError, TokenizerUnavailable
from .sampling import SamplingParams
from .session import Session

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class Engine:
    def __init__(self, name: str, spec: ModelSpec, weights, tokenizer, config: EngineConfig,
                 weights_digest: str, env: Env | None = None):
        if config.dtype not in DTYPES:
            raise RequestError(f"dtype must be one of {sorted(DTYPES)}, got {config.dtype!r}")
        if config.backend not in ("ring", "oracle"):
            raise RequestError(f"backend must be 'ring' or 'oracle', got {config.backend!r}")
        self.name = name
        self.env = env if env is not None else read_env()
        self.spec = spec
        self.config = config
        self.device = torch.device(config.device)
        self.dtype = DTYPES[config.dtype]
        self.cache_dtype = self.dtype
        self.backend = select(config, self.env)          # the device's wing, once per engine
        self.backend.check_model(spec, weights)
        self.weights = self.backend.prepare_weights(weights, self.dtype)
        self._tokenizer = tokenizer
        self.max_context = min(config.max_context or spec.max_context, spec.max_context)
        # int8 weights compute different K/V bits than float weights: a distinct encoding; an
        # int8 head moves only the logits -- every row is the float weights' -- so it shares
        # theirs.  (the family names the weight path; the dtype is the rows' dtype on the wire)
        rows_quant = "none" if config.quant in HEAD_ONLY else config.quant
        family = config.backend if rows_quant == "none" else f"{config.backend}+{rows_quant}"
        family += self.backend.encoding_tag       # the backend's arithmetic (CUDA: its version)
        self.encoding = Encoding(family, config.dtype)
        self._grammars = None
        self.fingerprint = {
            "architecture": spec.architecture,
            "layers": [[l.kind, l.window, l.rope] for l in spec.layers],
            "kv_heads": spec.num_kv_heads,
            "head_dim": spec.head_dim,
            "weights_digest": weights_digest,
        }
        if not spec.uniform_geometry:
            # per-layer planes (Gemma 4): each layer's [kv_heads, head_dim, kv_source]
            self.fingerprint["layer_geometry"] = [[l.kv_heads, l.head_dim, l.kv_source] for l in spec.layers]

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

    @property
    def grammars(self):
        """The grammar compiler for this model's tokenizer (constrained.py), built on first use."""
        if self._grammars is None:
            from .constrained import Grammars
            eos = dict.fromkeys([*self.spec.eos_token_ids, *self.tokenizer.eos_token_ids])
            self._grammars = Grammars(self.tokenizer.hf, self.spec.vocab_size, list(eos))
        return self._grammars

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

    def forward(self, sessions: list[Session], chunks: list[list[int]], all_logits: bool = False,
                pad: bool = True) -> torch.Tensor:
        """The one forward: `chunks[b]` (token ids) consumed by `sessions[b]`, every session in
        one step.  float32 logits [sum of chunk lengths, vocab] with `all_logits`, else [B, vocab].
        `pad`: chunk rows rounded up to a multiple of 16 with scratch rows (prefill, extend; see
        backends/step.py); a decode step is not padded.  Everything is checked before anything
        runs; a failure leaves every session as it was."""
        if len(sessions) != len(chunks):
            raise RequestError(f"forward got {len(sessions)} sessions and {len(chunks)} chunks")
        if len({id(s) for s in sessions}) != len(sessions):
            raise RequestError("a session appears twice in one forward")
        chunks = [s._validate(c) for s, c in zip(sessions, chunks)]
        return self._forward(sessions, chunks, all_logits, pad)

    def _forward(self, sessions, chunks, all_logits: bool, pad: bool, logits: bool = True) -> torch.Tensor:
        """`forward` for validated input (Session validates once per call, not per chunk)."""
        return self.backend.forward(self, sessions, chunks, all_logits, pad, logits)

    def decode_batch(self, sessions: list[Session], tokens: list[int]) -> torch.Tensor:
        """One decode step for several sessions: float32 logits [B, vocab].  Each row is bitwise
        what that session decoding alone gives wherever the backend is row-invariant (the int8
        CPU path; the other backends give each session its own pass, except CUDA's graph)."""
        if len(sessions) != len(tokens):
            raise RequestError(f"decode_batch got {len(sessions)} sessions and {len(tokens)} tokens")
        if not sessions:
            return torch.empty((0, self.spec.vocab_size))
        return self.forward(sessions, [[t] for t in tokens], all_logits=False, pad=False)

    def decode_greedy(self, sessions: list[Session], tokens: list[int],
                      max_tokens: int | list[int], stop_ids: Iterable[int] | None = None):
        """Greedy decoding of several sessions together, up to `max_tokens` steps each (an int
        for all, or one per session): session b consumes tokens[b], then each token it returns
        but the last; a token in `stop_ids` (default: the model's end-of-sequence ids) ends it
        and is not returned.  -> backends.greedy.Greedy (tokens, finish: "stop" | "length" |
        "nonfinite").  The tokens are what `decode_batch` and an argmax give step by step (NaN
        read as -inf, +inf as the largest float, as the server picks); on CUDA with
        MUSER_PIPELINE=on the steps are pipelined: step N+1 launched before step N is read back.  Everything is
        checked first; a failure leaves each session consistent (its lineage is what it consumed)."""
        from ..backends.greedy import Budget
        stops = self.spec.eos_token_ids if stop_ids is None else stop_ids
        run = Budget.check(self, sessions, tokens, max_tokens, stops)
        return self.backend.greedy(self, list(sessions), run)

    def greedy_steps(self, force: bool = False):
        """Greedy steps that can run one ahead of their reading (launch / collect / take_back,
        backends/greedy.py): the backend's pipeline where it has one (CUDA, MUSER_PIPELINE);
        with `force`, one step at a time underneath elsewhere; else None."""
        steps = self.backend.greedy_steps(self)
        if steps is None and force:
            from ..backends.greedy import SyncSteps
            steps = SyncSteps(self)
        return steps

    def stream_steps(self):
        """`greedy_steps` where the engine's own greedy loops take them (MUSER_PIPELINE on a
        backend with a pipeline), else None: what `stream` runs one step ahead with."""
        return self.greedy_steps() if self.backend.pipeline_default else None

    @property
    def exact_rows(self) -> bool:
        """Whether every op of a forward computes each row the same way whatever else shares the
        call -- one arithmetic per token (issue 12): the backend's word (the int8 CPU path with
        the native kernels; CUDA's step kernels, MUSER_CHUNKS=exact)."""
        self.backend.runner(self)                        # CUDA decides when its runner is built
        return self.backend.exact_rows

    @property
    def verify_cost(self) -> float:
        """A verification block's cost in decode steps (the backend's measured word)."""
        return self.backend.verify_cost

    @property
    def shared_chunks(self) -> bool:
        """Whether several sessions' chunks (verification blocks, say) are cheaper in one
        `forward` than one each, every row bitwise what it is alone (the backend's word)."""
        return self.exact_rows and self.backend.shared_chunks

    def runner_stats(self) -> dict:
        """The decode runner's counters once it is built (backend's `runner_stats`)."""
        return self.backend.runner_stats()

    def decode_runner(self):
        """The CUDA graph runner for decode steps, or None (other backends, oracle, unsupported)."""
        return self.backend.runner(self)

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
               speculative=None, block: int | None = None,
               stats: dict | None = None, grammar=None, controls=None) -> Iterator[int]:
        """Yield generated token ids (stops at an end-of-sequence id, not yielded, or when
        `grammar` (constrained.Grammar) is complete).  `controls`: logits_processors.Controls.
        `speculative`: "prompt-lookup" or a drafter (`muser.engine.make_drafter("draft:MODEL",
        engine)`, loaded once and passed to every call)."""
        from .generate import generate_ids
        from .picker import TokenPicker
        params = SamplingParams(temperature, top_p, top_k, seed)
        if max_tokens < 0:
            raise RequestError(f"max_tokens must be >= 0, got {max_tokens}")
        ids = self.encode_prompt(prompt, chat)
        constraint = self.grammars.constraint(grammar) if grammar is not None else None
        picker = TokenPicker(params, controls, constraint, prompt=ids)
        s = session if session is not None else self.new_session()
        return generate_ids(self, s, ids, max_tokens, params, speculative=speculative,
                            block=block, stats=stats, picker=picker)

    def generate_batch(self, prompts: list[str | list[int]], max_tokens: int = 128,
                       temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
                       seed: int | None = None, stop: Iterable[str] | str | None = None,
                       chat: bool = False) -> list[str]:
        """`generate` for several prompts at once, their decode steps batched: answer i is what
        `generate(prompts[i], ...)` returns alone (with `seed`, prompt i samples with seed + i).
        Greedy prompts run as one `decode_greedy` (pipelined on CUDA)."""
        from .generate import generate_many, stream_text
        if max_tokens < 0:
            raise RequestError(f"max_tokens must be >= 0, got {max_tokens}")
        ids = [self.encode_prompt(p, chat) for p in prompts]
        if any(not x for x in ids):
            raise RequestError("every prompt needs at least one token")
        params = [SamplingParams(temperature, top_p, top_k, None if seed is None else seed + i)
                  for i in range(len(ids))]
        outs = generate_many(self, ids, max_tokens, params)
        return ["".join(stream_text(self, iter(o), stop)) for o in outs]

    def generate(self, prompt: str | list[int], max_tokens: int = 128, temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, seed: int | None = None,
                 stop: Iterable[str] | str | None = None, **kw) -> str:
        """Generate text; stops at end-of-sequence, `max_tokens` or the first `stop` string."""
        from .generate import stream_text
        return "".join(stream_text(self, self.stream(prompt, max_tokens, temperature, top_p,
                                                     top_k, seed, **kw), stop))
