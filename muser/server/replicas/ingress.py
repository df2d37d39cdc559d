"""The ingress: one HTTP surface in front of the engine replicas.

Owns (runs as a Ray Serve ingress deployment behind Ray's HTTP proxy):
  * forwarding every request to an engine replica through a deployment handle
    (whose MuserRouter picks the replica) and relaying the response as the
    replica's own app wrote it;
  * routing hints for generation requests: the `x-session-id` header (hashed)
    and the prompt's token ids and block keys -- rendered with the model's
    tokenizer and chat template exactly as a replica renders them, using the
    server's own request schemas; a body that does not parse gets no hints and
    the replica answers it with the single server's 4xx;
  * failure handling: a replica that dies before any byte reached the client is
    retried on another (up to `retries` times), one that dies mid-stream ends
    the SSE stream with an OpenAI-shaped error event (`code: replica_failed`,
    retry the request), and a request no replica accepts within
    `route_timeout_s` gets a 503 with Retry-After -- never a hang;
  * `/health` and `/metrics` over all replicas (per replica and summed) and
    `GET /v1/replicas`; `/v1/slots*` is refused (slots are per replica: the
    shared tier replaces slot files here).
The API key is checked here before any work, and again by each replica.
Does not own: serving (each replica's muser.server app), the routing policy.
"""
from __future__ import annotations

import asyncio
import json
import logging

from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from ..http_errors import Internal, NotFound, ServerError, Unavailable
from ..metrics import Metrics
from ..transport import check_bearer, read_body
from .keys import block_keys, session_key
from .promtext import merge
from .settings import ReplicaSpec
from .wire import Forwarded

log = logging.getLogger("muser.replicas")
FORWARDED_HEADERS = {b"authorization", b"content-type", b"accept", b"user-agent"}


def _error(err: ServerError) -> JSONResponse:
    headers = {"retry-after": "1"} if err.status in (429, 503) else None
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


def _retryable(exc: BaseException) -> bool:
    from ray.exceptions import RayActorError
    from ray.serve.exceptions import ReplicaUnavailableError
    return isinstance(exc, (RayActorError, ReplicaUnavailableError))


class Relay(StreamingResponse):
    """A replica's response head as it sent it, and its body pieces as they come."""

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], body):
        super().__init__(body, status_code=status)
        self.raw_headers = [(k, v) for k, v in headers]


class Ingress:
    """Plain logic of the ingress; deployments.py wraps it in a Ray Serve deployment."""

    def __init__(self, handle, spec: ReplicaSpec):
        self.handle, self.spec = handle, spec
        self.block = spec.routing.block_tokens
        self.metrics = Metrics(prefix="muser_ingress_")
        self.tokenizer = None
        try:
            from ...engine.loader import resolve
            from ...model.tokenizer import load_tokenizer
            self.tokenizer = load_tokenizer(resolve(spec.engine.model)[1])
        except Exception as e:             # noqa: BLE001 -- routing then uses sessions only
            log.warning("ingress: no tokenizer for prefix routing (%s: %s)", type(e).__name__, e)

    # ------------------------------------------------------------------ gates and hints
    def check_auth(self, request: Request) -> None:
        check_bearer(request, self.spec.server.api_key)

    async def read_body(self, request: Request) -> bytes:
        # the server's own reader: bounded as it arrives, and within the body timeout
        return await read_body(request, self.spec.server.max_body_bytes, self.spec.server.body_timeout)

    def prompt_of(self, path: str, body: bytes) -> list[int]:
        """The token ids a replica will render for this body; [] when it will not parse."""
        if self.tokenizer is None:
            return []
        from ..schemas import ChatCompletionRequest, CompletionRequest
        try:
            if path == "/v1/chat/completions":
                req = ChatCompletionRequest.model_validate_json(body)
                return list(self.tokenizer.apply_chat_template(req.plain_messages(),
                                                               add_generation_prompt=True))
            req = CompletionRequest.model_validate_json(body)
            p = req.single_prompt()
            return self.tokenizer.encode(p) if isinstance(p, str) else [int(t) for t in p]
        except Exception:                  # noqa: BLE001 -- the replica gives the real 4xx
            return []

    async def forwarded(self, request: Request, path: str) -> Forwarded:
        body = await self.read_body(request)
        headers = tuple((k, v) for k, v in request.scope["headers"] if k in FORWARDED_HEADERS)
        fwd = Forwarded(request.method, path, request.scope.get("query_string", b""), headers, body)
        if not fwd.generation:
            return fwd
        self.check_auth(request)
        prompt = await asyncio.to_thread(self.prompt_of, path, body)
        session = session_key(request.headers.get(self.spec.routing.session_header))
        return Forwarded(fwd.method, path, fwd.query, headers, body, session, tuple(prompt),
                         tuple(block_keys(prompt, self.block)))

    # ------------------------------------------------------------------ dispatch
    async def dispatch(self, fwd: Forwarded) -> Response:
        attempts = self.spec.routing.retries + 1
        last = None
        for attempt in range(attempts):
            if attempt:
                self.metrics.inc("retries_total")
            gen = self.handle.options(stream=True).serve_request.remote(fwd)
            try:
                await asyncio.wait_for(gen.__anext__(), self.spec.routing.route_timeout_s)
                _, status, headers = await gen.__anext__()
                first = await _next_or_none(gen)
            except asyncio.TimeoutError:
                gen.cancel()
                self.metrics.inc("route_timeouts_total")
                return _error(Unavailable(f"no replica accepted the request within "
                                          f"{self.spec.routing.route_timeout_s:g}s; retry later"))
            except asyncio.CancelledError:
                gen.cancel()
                raise
            except Exception as e:          # noqa: BLE001
                gen.cancel()
                if _retryable(e):
                    self.metrics.inc("replica_failures_total")
                    log.warning("ingress: replica failed before replying (%s); attempt %d of %d",
                                type(e).__name__, attempt + 1, attempts)
                    last = e
                    continue
                return _error(_map(e))
            sse = dict(headers).get(b"content-type", b"").startswith(b"text/event-stream")
            return Relay(status, headers, self._relay(gen, first, sse))
        return _error(Unavailable(f"the replica serving this request failed {attempts} time(s) "
                                  f"({type(last).__name__}); retry the request"))

    async def _relay(self, gen, first, sse: bool):
        done = False
        try:
            item = first
            while item is not None:
                yield item[1]
                item = await _next_or_none(gen)
            done = True
        except asyncio.CancelledError:
            raise
        except Exception as e:              # noqa: BLE001 -- never a hang, never a traceback
            self.metrics.inc("stream_failures_total")
            log.warning("ingress: replica failed mid-response (%s: %s)", type(e).__name__, e)
            if sse:
                err = Unavailable("the replica serving this stream failed mid-response; "
                                  "retry the request", code="replica_failed")
                yield f"data: {json.dumps(err.body())}\n\n".encode()
            done = True
        finally:
            if not done:
                gen.cancel()

    async def statuses(self, metrics: bool) -> tuple[list[dict], int]:
        """(status of every replica that answered, how many did not)."""
        try:
            results = await self.handle.broadcast("replica_status", metrics).results_async(
                timeout_s=10, return_exceptions=True)
        except Exception as e:              # noqa: BLE001 -- no replica at all
            log.warning("ingress: status broadcast failed: %s: %s", type(e).__name__, e)
            return [], 0
        ok = [r for r in results if isinstance(r, dict)]
        return ok, len(results) - len(ok)


async def _next_or_none(gen):
    try:
        return await gen.__anext__()
    except StopAsyncIteration:
        return None


def _map(exc: BaseException) -> ServerError:
    from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError
    if isinstance(exc, BackPressureError):
        return Unavailable("every replica's queue is full; retry later")
    if isinstance(exc, DeploymentUnavailableError):
        return Unavailable("the engine replicas are unavailable; retry later")
    log.error("ingress: unexpected error from a replica: %s: %s", type(exc).__name__, exc)
    return Internal("internal server error")


def build_app(ingress: Ingress) -> FastAPI:
    app = FastAPI(title="muser (replicas)", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(ServerError)
    async def _server_error(request, exc: ServerError):
        return _error(exc)

    @app.get("/health")
    async def health():
        reps, silent = await ingress.statuses(metrics=False)
        healthy = [r for r in reps if r.get("healthy")]
        body = {"status": "healthy" if healthy else "unhealthy", "replicas": reps,
                "unreachable": silent, "model": reps[0]["model"] if reps else None}
        return JSONResponse(body, status_code=200 if healthy else 503)

    @app.get("/metrics")
    async def metrics():
        reps, silent = await ingress.statuses(metrics=True)
        m = ingress.metrics
        m.gauge("replicas", "replicas that answered the scrape", lambda: len(reps))
        m.gauge("replicas_unreachable", "replicas that did not answer the scrape", lambda: silent)
        text = merge({r["replica"]: r.get("metrics", "") for r in reps}, m.render())
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/replicas")
    async def replicas(request: Request):
        ingress.check_auth(request)
        reps, silent = await ingress.statuses(metrics=False)
        return {"object": "list", "data": reps, "unreachable": silent}

    @app.api_route("/v1/slots", methods=["GET", "POST"])
    @app.api_route("/v1/slots/{rest:path}", methods=["GET", "POST"])
    async def slots(request: Request):
        raise NotFound("slot endpoints are per replica and not served through the replica "
                       "router; sessions move through the shared tier (--prefix-cache-dir); "
                       "see GET /v1/replicas")

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
    async def forward(request: Request, path: str):
        fwd = await ingress.forwarded(request, "/" + path)
        ingress.metrics.inc("requests_total", labels={"route": "generation" if fwd.generation
                                                       else "other"})
        return await ingress.dispatch(fwd)

    return app
