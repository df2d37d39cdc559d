"""The FastAPI application: routes, auth, error shape, lifespan.

Owns: `create_app(engine, ServerConfig)` -- the HTTP surface (chat and text
completions, tokenize / detokenize, models, health, metrics, slot save / restore), the exception
handlers that answer every failure in OpenAI's error shape (never a
traceback; bad input is always 4xx), and starting / stopping the worker.
Does not own: serving logic (service.py), validation (schemas.py), the slot
pool (slots.py) or the context policy (policy.py).
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse, PlainTextResponse

from ..errors import MuserError
from .config import ServerConfig
from .http_errors import ClientGone, InvalidRequest, NotFound, ServerError, to_http
from .persist import pack_path, parse_slot_id, restore_slot, save_slot
from .raw_policy import RawReplay
from .schemas import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from .service import ServerState
from .transport import read_body
from . import tokenize_api, tools as toolkit

log = logging.getLogger("muser.server")


def create_app(engine, config: ServerConfig | None = None) -> FastAPI:
    config = config or ServerConfig()
    state = ServerState(engine, config)

    @asynccontextmanager
    async def lifespan(app):
        state.pool.loop = asyncio.get_running_loop()
        state.scheduler.start()
        log.info("serving %s on %d slot(s), max_context %d, reserve %d, policy %s",
                 state.model_id, len(state.pool.slots), state.max_context,
                 state.limits.output_reserve, state.limits.policy)
        if state.base_model_note:
            log.warning("%s", state.base_model_note)
        try:
            yield
        finally:
            state.scheduler.stop()
            if state.prefix is not None:
                state.prefix.store.close()         # finish queued disk-tier writes

    app = FastAPI(title="muser", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.muser = state

    # ------------------------------------------------------------------ errors
    def _count(request, status: int) -> None:
        path = request.url.path
        endpoint = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}.get(
            path, "slots" if path.startswith("/v1/slots/") else "other")
        state.metrics.inc("requests_total", labels={"endpoint": endpoint, "status": str(status)})

    def _error(exc: ServerError, request=None) -> JSONResponse:
        if request is not None:
            _count(request, exc.status)
        headers = {"retry-after": "1"} if exc.status in (429, 503) else None
        if exc.status in (408, 413):
            # The body was refused before it was read: what is left of it is still on the
            # wire, and on a kept-alive connection it would be parsed as the next request's
            # head (a 431 to the client's next, innocent request).  Close after answering.
            headers = {"connection": "close"}
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    @app.exception_handler(ServerError)
    async def _server_error(request, exc: ServerError):
        if isinstance(exc, ClientGone):       # nobody to answer: a quiet, counted disconnect
            state.metrics.inc("disconnects_total")
            _count(request, exc.status)
            return PlainTextResponse("", status_code=exc.status)
        return _error(exc, request)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc: StarletteHTTPException):
        if exc.status_code == 404:
            return _error(NotFound(f"no route {request.method} {request.url.path}"), request)
        err = ServerError(str(exc.detail))
        err.status, err.type, err.code = exc.status_code, "invalid_request_error", None
        return _error(err, request)

    # Typed errors get their own handlers: Starlette answers a handler registered for plain
    # `Exception` and then re-raises (uvicorn logs a traceback and resets the connection).
    @app.exception_handler(RecursionError)
    async def _too_deep(request, exc: RecursionError):
        return _error(to_http(exc), request)

    @app.exception_handler(ClientDisconnect)
    async def _gone(request, exc: ClientDisconnect):
        return await _server_error(request, ClientGone("the client disconnected"))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request, exc):
        return _error(InvalidRequest(f"invalid request: {exc.errors()[:3]}"), request)

    @app.exception_handler(MuserError)
    async def _muser_error(request, exc: MuserError):
        return _error(to_http(exc), request)        # answered here: not logged as a crash

    @app.exception_handler(Exception)
    async def _unexpected(request, exc: Exception):
        err = to_http(exc)
        if err.status >= 500:
            log.exception("unhandled error on %s", request.url.path, exc_info=exc)
        return _error(err, request)

    # ------------------------------------------------------------------ routes
    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        req = await state.admit(request, ChatCompletionRequest)
        tools = toolkit.toolset(req)
        decoding = await asyncio.to_thread(state.decoding, req, True, tools)
        messages = toolkit.render_messages(req.messages, tools)
        candidate, _ = await asyncio.to_thread(state.prompts.chat, messages, req.template_variables)
        return await state.serve(request, req, candidate, chat=True, max_tokens=req.token_limit,
                                 replay=lambda plan: plan.replay, decoding=decoding, tools=tools)

    @app.post("/v1/completions")
    async def completions(request: Request):
        req = await state.admit(request, CompletionRequest)
        decoding = await asyncio.to_thread(state.decoding, req, False)
        prompt = req.single_prompt()
        candidate, tokens = await asyncio.to_thread(state.prompts.raw, prompt)
        echo = ""
        if req.echo:
            echo = prompt if isinstance(prompt, str) else await asyncio.to_thread(
                state.tokenizer.decode, prompt)

        def replay(plan):
            if not plan.shifted:
                return None
            return lambda epoch: RawReplay(tuple(tokens[:plan.prefix]), plan.suffix_start, epoch)
        return await state.serve(request, req, candidate, chat=False, max_tokens=req.max_tokens,
                                 replay=replay, decoding=decoding, echo=echo)

    @app.post("/tokenize")
    async def tokenize(request: Request):
        req = await _tool_request(request, TokenizeRequest)
        return await asyncio.to_thread(tokenize_api.tokenize, state, req)

    @app.post("/detokenize")
    async def detokenize(request: Request):
        req = await _tool_request(request, DetokenizeRequest)
        return await asyncio.to_thread(tokenize_api.detokenize, state, req)

    async def _tool_request(request: Request, cls):
        """Auth, the bounded body, the model when named (no health gate: the tokenizer
        answers while the pool is unhealthy)."""
        state.check_auth(request)
        req = await state.parse(request, cls)
        if req.model is not None:
            state.check_model(req.model)
        return req

    @app.get("/v1/models")
    async def models(request: Request):
        state.check_auth(request)
        return {"object": "list", "data": [_model_card(state)]}

    @app.get("/v1/models/{model_id:path}")
    async def model(request: Request, model_id: str):
        state.check_auth(request)
        state.check_model(model_id)
        return _model_card(state)

    @app.get("/health")
    async def health():
        pool = state.pool
        body = {"model": state.model_id, "slots": len(pool.slots), "busy": pool.busy_count,
                "queued": pool.queue_depth}
        if pool.healthy:
            return JSONResponse({"status": "healthy", **body})
        return JSONResponse({"status": "unhealthy", "reason": pool.unhealthy_reason, **body},
                            status_code=503)

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(state.metrics.render(),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    async def _slot_file_op(request: Request, slot_id: str, op: str):
        state.check_auth(request)
        sid = parse_slot_id(slot_id, len(state.pool.slots))
        body = await read_body(request, state.config.max_slot_body_bytes, state.config.body_timeout)
        filename = None
        if body.strip():
            try:
                data = json.loads(body.decode("utf-8"))
            except (UnicodeDecodeError, ValueError, RecursionError):
                raise InvalidRequest("the body must be a JSON object like "
                                     '{"filename": "name.pack"}') from None
            if not isinstance(data, dict) or set(data) - {"filename"}:
                raise InvalidRequest('the body must be a JSON object like {"filename": "name.pack"}')
            filename = data.get("filename")
        path = pack_path(state.config.session_dir, filename, sid)
        slot = state.pool.lease_slot(sid)
        try:
            if op == "save":
                return await asyncio.to_thread(save_slot, slot, path, state.config.pack_key)
            return await asyncio.to_thread(restore_slot, engine, slot, path, state.config.pack_key)
        finally:
            state.pool.release(slot)

    @app.post("/v1/slots/{slot_id}/save")
    async def save(request: Request, slot_id: str):
        return await _slot_file_op(request, slot_id, "save")

    @app.post("/v1/slots/{slot_id}/restore")
    async def restore(request: Request, slot_id: str):
        return await _slot_file_op(request, slot_id, "restore")

    @app.get("/v1/slots")
    async def slots(request: Request):
        state.check_auth(request)
        return {"object": "list", "data": [
            {"id": s.id, "busy": s.busy, "position": len(s.tokens), "context_epoch": s.epoch}
            for s in state.pool.slots]}

    @app.get("/v1/prefix_cache")
    async def prefix_cache(request: Request):
        """Read-only: the cut store's size per tier, budgets, counts and hit figures."""
        state.check_auth(request)
        if state.prefix is None:
            return {"object": "prefix_cache", "enabled": False}
        return {"object": "prefix_cache", "enabled": True, **state.prefix.stats()}

    return app


def _model_card(state: ServerState) -> dict:
    return {"id": state.model_id, "object": "model", "created": int(time.time()),
            "owned_by": "muser", "max_context": state.max_context}
