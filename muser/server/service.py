"""Serving one request: prompt -> plan -> slot lease -> worker job -> OpenAI response.

Owns: `ServerState` (the engine, the slot pool, the worker, metrics, the
limits), the request's gates (auth, body, model, health), waiting for a slot
while watching for the client to leave, and shaping the job's events into a
JSON body or an SSE stream.
Does not own: validation (schemas.py), the request's decoding controls
(controls.py: `DecodingControls`, which `ServerState` inherits -- sampling,
stop ids, penalties, the grammar; moved out of this file), the prompt's
per-slot candidates (candidates.py), placement (slots.py), model steps
(scheduler.py), routes (app.py).
"""
from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from typing import Any, Callable

from starlette.requests import Request
from starlette.responses import Response

from ..engine.warmup import warm_up
from ..backends.host import on_short_thread
from .choices import Decoding
from .config import ServerConfig
from .admission import PromptGate
from .candidates import Prompts
from .controls import DecodingControls
from .http_errors import InvalidRequest, ModelNotFound, clip
from .metrics import Metrics
from .outbox import Outbox
from .policy import Limits
from .responses import ClientWatch, Formatter
from .sse import SSEResponse
from .scheduler import Job, Scheduler
from .prefix import PrefixCache
from .slots import SlotPool
from .text import SharedTokenizer, base_model_note, chars_per_token_bound, turn_marker_ids
from .transport import check_bearer, read_body

log = logging.getLogger("muser.server")


class ServerState(DecodingControls):
    def __init__(self, engine, config: ServerConfig):
        self.engine, self.config = engine, config
        if not getattr(engine, "has_tokenizer", True):
            raise ValueError(f"model {engine.name!r} was loaded without tokenizer files; "
                             "muser serve needs a tokenizer (add tokenizer.json)")
        self.tokenizer = SharedTokenizer(engine.tokenizer)
        self.turn_markers = frozenset(turn_marker_ids(engine.tokenizer))
        self.eos_ids = frozenset(engine.spec.eos_token_ids or ()) | frozenset(
            self.tokenizer.eos_token_ids)     # what ends an output (scheduler.eos likewise)
        self.tokenizer_speaks_harmony = bool(getattr(engine.tokenizer, "harmony", False))
        self.base_model_note = base_model_note(engine)
        self.model_id = config.model_id or engine.name
        self.max_context = config.effective_max_context(engine.max_context)
        self.limits = Limits(self.max_context, config.effective_reserve(self.max_context),
                             config.context_policy, config.keep, config.shift_keep)
        self.metrics = Metrics()
        self.outbox: Outbox | None = None         # the worker's road to the serving loop
        # allocated on a thread of its own: this thread must not keep an OpenMP pool beside the
        # scheduler's (backends/host.py: a second pool made every step 1.3-1.8x slower on 2 CPUs)
        self.prefix, sessions = on_short_thread(
            lambda: (make_prefix_cache(engine, config),
                     [engine.new_session() for _ in range(config.slots + 1)]), name="muser-slots")
        self.pool = SlotPool(sessions[:-1], sessions[-1], config.queue_size, config.queue_timeout,
                             peek=self.prefix.peek if self.prefix else None)
        self.scheduler = Scheduler(engine, self.pool, self.metrics, self.max_context,
                                   config.batch_decode, self.tokenizer,
                                   prefill_budget=config.prefill_budget,
                                   prefill_share=config.prefill_share, prefix=self.prefix,
                                   stream_interval=config.stream_interval)
        if self.prefix is not None:
            self.metrics.collector(self.prefix.metric_lines)
        if config.pipeline != "off" and config.batch_decode:
            self.scheduler.steps = engine.greedy_steps(force=config.pipeline == "on")
        if config.warmup:
            try:
                warm = warm_up(engine, sessions[:-1] if config.batch_decode else sessions[:1],
                               self.scheduler.steps)
            except Exception as e:             # noqa: BLE001 -- a speed-up: serve without it
                warm = {}
                log.warning("start-up warm-up failed (%s: %s); the first requests will compile "
                            "and capture instead", type(e).__name__, e)
            if warm:
                log.info("warmed up %d decode batch size(s) in %.1f s (%d graphs captured)",
                         warm["batches"], warm["seconds"], warm["captures"])
        if config.speculative:
            from .speculation import SpecStep
            self.scheduler.spec = SpecStep(config.spec_block, engine.verify_cost)
            # default: any number of choices where their blocks share one forward; else one (on
            # CUDA a block costs ~3 decode steps and one batched step serves every session)
            self.scheduler.spec_max_batch = (
                config.spec_max_batch if config.spec_max_batch is not None
                else (sys.maxsize if engine.shared_chunks else 1))
        self.gate = PromptGate(self.tokenizer, self.limits, config.max_messages,
                               chars_per_token_bound(engine.tokenizer))
        self.prompts = Prompts(self.tokenizer, self.gate, self.limits, self.prefix,
                               engine.spec.bos_token_id, engine.spec.vocab_size)
        m = self.metrics
        m.gauge("slots_total", "serving slots", lambda: len(self.pool.slots))
        m.gauge("slots_busy", "slots serving a request", lambda: self.pool.busy_count)
        m.gauge("queue_depth", "requests waiting for a slot", lambda: self.pool.queue_depth)
        m.gauge("healthy", "1 while the model pool is healthy", lambda: float(self.pool.healthy))
        for key, help_ in (("captures", "CUDA graphs captured for decode steps"),
                           ("capture_seconds", "seconds spent capturing them (warm-up included)"),
                           ("replays", "decode steps replayed from a captured graph"),
                           ("eager", "decode steps run eagerly (no graph)")):
            m.gauge(f"graph_{key}", help_, lambda k=key: float(engine.runner_stats().get(k, 0)))
        self._token_text = None
        # The grammar engine's tokenizer reads the whole vocabulary once (~3 s for 262k tokens):
        # build it now, off the request path (its lock makes an early request wait for it).
        threading.Thread(target=lambda: engine.grammars.tokenizer, name="muser-grammar-warm",
                         daemon=True).start()

    @property
    def token_text(self):
        if self._token_text is None:
            from .logprobs import TokenText
            self._token_text = TokenText(self.engine)
        return self._token_text

    # ------------------------------------------------------------------ gates
    def check_auth(self, request: Request) -> None:
        check_bearer(request, self.config.api_key)

    def check_model(self, model: str) -> None:
        if model != self.model_id:
            raise ModelNotFound(f"the model {model!r} does not exist; this server serves "
                                f"{self.model_id!r}", param="model")

    async def admit(self, request: Request, cls):
        """The gates every generation request passes, in order: auth, body, model, health."""
        self.check_auth(request)
        req = await self.parse(request, cls)
        self.check_model(req.model)
        self.pool.check_healthy()
        return req

    async def parse(self, request: Request, cls):
        body = await read_body(request, self.config.max_body_bytes, self.config.body_timeout)
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InvalidRequest(f"the request body is not valid UTF-8 (byte {e.start})") from None
        try:
            return cls.model_validate_json(body)
        except ValueError as e:            # pydantic ValidationError
            errs = getattr(e, "errors", lambda: [])()
            if not errs:
                raise InvalidRequest(f"invalid request: {e}") from None
            parts = []
            for err in errs[:3]:
                loc = clip(".".join(str(x) for x in err.get("loc", ())), 120)
                parts.append(f"{loc + ': ' if loc else ''}{clip(err.get('msg', 'invalid'), 200)}")
            first = ".".join(str(x) for x in errs[0].get("loc", ())) or None
            raise InvalidRequest("invalid request: " + "; ".join(parts), param=first) from None
        except RecursionError:
            raise InvalidRequest("the request JSON is nested too deeply") from None

    # ------------------------------------------------------------------ serving
    async def serve(self, request: Request, req, candidate, *, chat: bool,
                    max_tokens: int | None, replay: Callable[[Any], Callable[[int], Any]],
                    decoding: Decoding, tools=None, echo: str = "") -> Response:
        if max_tokens is not None and max_tokens > self.max_context:
            raise InvalidRequest(f"max_tokens ({max_tokens}) exceeds the context of "
                                 f"{self.max_context} tokens", param="max_tokens")
        t0 = time.perf_counter()
        watch = ClientWatch(request)
        try:
            placement = await self._lease(candidate, watch)
        except BaseException:
            watch.close()
            raise
        if placement is None:                       # the client left while queued
            watch.close()
            self.metrics.inc("disconnects_total")
            return Response(status_code=499)
        self.metrics.observe("queue_wait_seconds", placement.queue_wait)
        room = self.max_context - len(placement.prompt)
        max_new = room if max_tokens is None else min(max_tokens, room)
        # Under a grammar the grammar decides where the output ends: a stop string cutting it
        # early would break "finish_reason stop => valid" (docs/server.md).
        stops = [] if decoding.grammar is not None else req.stops()
        job = Job(placement, decoding, max_new, stops, self._outbox(),
                  replay=replay(placement.plan))
        watch.on_gone.append(job.cancel)
        watch.on_gone.append(self.scheduler.wake)
        try:
            self.scheduler.submit(job)
        except BaseException:
            watch.close()
            self.pool.release(placement.slot)
            raise
        fmt = Formatter(self, req, chat, t0, tools=tools, echo=echo)
        handed_off = False
        try:
            first = await fmt.next_event(job, watch)       # "start" or "error": a real status
            if first is None or first[0] != "start":
                return fmt.early_exit(first)
            fmt.start(first[1], job)
            if req.stream:
                def finalize():
                    watch.close()
                    job.cancel()
                    self.scheduler.wake()
                handed_off = True
                return self._noted(SSEResponse(fmt.stream(job), finalize,
                                               push=(job, fmt.shaper(job))), chat)
            return self._noted(await fmt.whole(job, watch), chat)
        finally:
            if not handed_off:
                watch.close()
                job.cancel()
                self.scheduler.wake()

    def _noted(self, response: Response, chat: bool) -> Response:
        """A chat answer from a base model says so in a header (and in the `muser` field)."""
        if chat and self.base_model_note and response.status_code == 200:
            response.headers["x-muser-warning"] = ("base model (not instruction-tuned): chat "
                                                   "replies may ramble; see the muser.warning field")
        return response

    def _outbox(self) -> Outbox:
        """The running loop's outbox (one a loop: a test may serve the app from a second one)."""
        loop = asyncio.get_running_loop()
        if self.outbox is None or self.outbox.loop is not loop:
            self.outbox = Outbox(loop)
        return self.outbox

    async def _lease(self, candidate, watch: ClientWatch):
        acquire = asyncio.ensure_future(self.pool.acquire(candidate))
        gone = asyncio.ensure_future(watch.gone.wait())
        try:
            await asyncio.wait({acquire, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not acquire.done():
            acquire.cancel()
            try:
                await acquire
            except (asyncio.CancelledError, Exception):
                pass
            return None
        return acquire.result()


def make_prefix_cache(engine, config: ServerConfig) -> PrefixCache | None:
    """The server's cut store (muser.store) from --prefix-cache-*; None when the size is 0."""
    if config.prefix_cache_bytes == 0:
        return None
    from ..store import CutStore
    store = CutStore(engine, ram_bytes=config.prefix_cache_bytes, disk_dir=config.prefix_cache_dir,
                     disk_bytes=config.prefix_cache_disk_bytes, key=config.pack_key,
                     block_size=config.prefix_cache_block)
    log.info("prefix cache: RAM %s bytes, disk %s, block %d tokens", store.index.budget["ram"],
             config.prefix_cache_dir or "off", store.block_size)
    return PrefixCache(store)
