"""What travels between the ingress and an engine replica.

Owns: `Forwarded` (one HTTP request: method, path, headers, body, plus the
routing hints the ingress computed -- hashed session id, the prompt's token
ids and block keys) and the message kinds a replica streams back:
  ("accepted", replica)             at once: the request reached a live replica
  ("start", status, headers)        the response head
  ("body", bytes)*                  the response body, in the app's own pieces
A replica that dies raises in the caller's iterator instead of sending more.
Does not own: computing the hints (ingress.py) or using them (router.py, core.py).
"""
from __future__ import annotations

from dataclasses import dataclass

GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions")


@dataclass(frozen=True)
class Forwarded:
    method: str
    path: str
    query: bytes = b""
    headers: tuple[tuple[bytes, bytes], ...] = ()
    body: bytes = b""
    session: str | None = None          # keys.session_key of the x-session-id header
    prompt: tuple[int, ...] = ()        # the rendered prompt's token ids (empty: unknown)
    keys: tuple[int, ...] = ()          # keys.block_keys(prompt, block)

    @property
    def generation(self) -> bool:
        return self.method == "POST" and self.path in GENERATION_PATHS
