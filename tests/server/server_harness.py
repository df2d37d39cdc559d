"""A real uvicorn server on 127.0.0.1 (random free port) in a thread, for black-box tests."""
from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time

import httpx
import uvicorn

from muser.server.app import create_app
from muser.server.config import ServerConfig
from muser.server.transport import uvicorn_config


class Running:
    def __init__(self, app, server, thread, port):
        self.app, self.server, self.thread, self.port = app, server, thread, port
        self.base = f"http://127.0.0.1:{port}"
        self.state = app.state.muser

    def client(self, api_key: str = "none", **kw):
        import openai
        return openai.OpenAI(base_url=self.base + "/v1", api_key=api_key, max_retries=0,
                             timeout=kw.pop("timeout", 120), **kw)

    def async_client(self, api_key: str = "none", **kw):
        import openai
        return openai.AsyncOpenAI(base_url=self.base + "/v1", api_key=api_key, max_retries=0,
                                  timeout=kw.pop("timeout", 120), **kw)

    def http(self, **kw) -> httpx.Client:
        return httpx.Client(base_url=self.base, timeout=kw.pop("timeout", 120), **kw)

    def wait_idle(self, timeout: float = 30.0) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.state.pool.busy_count == 0 and not self.state.scheduler._active:
                return
            time.sleep(0.02)
        raise AssertionError("server did not go idle")


@contextlib.contextmanager
def serve(engine, **config):
    cfg = ServerConfig(**config)
    app = create_app(engine, cfg)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn_config(app, cfg, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started:
        if time.time() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield Running(app, server, thread, port)
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()


async def chat_once(ac, messages: list[dict], max_tokens: int, stream: bool) -> tuple[str, int]:
    """One greedy chat completion through an async openai client: (text, completion_tokens)."""
    if not stream:
        r = await ac.chat.completions.create(model="tiny", messages=messages, max_tokens=max_tokens,
                                             temperature=0)
        return r.choices[0].message.content, r.usage.completion_tokens
    text, n = "", 0
    async for ch in await ac.chat.completions.create(model="tiny", messages=messages, max_tokens=max_tokens,
                                                     temperature=0, stream=True,
                                                     stream_options={"include_usage": True}):
        if ch.choices:
            text += ch.choices[0].delta.content or ""
        if ch.usage:
            n = ch.usage.completion_tokens
    return text, n


def chat_burst(srv: Running, requests: list[tuple[list[dict], int]]) -> list[tuple[str, int]]:
    """Send every (messages, max_tokens) at once from one async client, odd ones streamed;
    results in request order."""
    async def burst():
        ac = srv.async_client()
        try:
            return await asyncio.gather(*(chat_once(ac, m, n, stream=bool(i % 2))
                                          for i, (m, n) in enumerate(requests)))
        finally:
            await ac.close()
    return asyncio.run(burst())


def completions_burst(srv: Running, prompts: list, **kw) -> list:
    """One /v1/completions request per prompt, all at once from one async client (`kw`: the
    request's other fields); the responses in prompt order."""
    async def burst():
        ac = srv.async_client()
        try:
            return await asyncio.gather(*(ac.completions.create(model=srv.state.model_id,
                                                                prompt=p, **kw)
                                          for p in prompts))
        finally:
            await ac.close()
    return asyncio.run(burst())


@contextlib.contextmanager
def serve_front(engine, **config):
    """The app in this process (a thread runs bridge.serve_split), HTTP in a real front
    process (`muser serve --front-process`'s layout)."""
    from muser.server.bridge import serve_split
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = ServerConfig(port=port, **config)
    app = create_app(engine, cfg)
    fronts, result = [], []
    thread = threading.Thread(target=lambda: result.append(
        serve_split(app, cfg, "warning", on_start=fronts.append)), daemon=True)
    thread.start()
    deadline = time.time() + 60
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.time() > deadline or not thread.is_alive():
            raise RuntimeError(f"the front did not start (serve_split: {result})")
        time.sleep(0.05)
    running = Running(app, None, thread, port)
    running.front = fronts[0]
    try:
        yield running
    finally:
        fronts[0].terminate()
        thread.join(20)
        assert result == [0], f"serve_split ended with {result}"
