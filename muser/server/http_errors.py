"""HTTP errors in OpenAI's JSON shape, and the mapping from muser's typed errors.

Owns: the server's own error types (each with a status, an OpenAI error
`type` and `code`) and `to_http(exc)`, the single place a muser exception
becomes a status code.  Does not own: deciding when to raise.

Status map:  400 invalid request (RequestError, ContextOverflow as
`context_length_exceeded`, pack/snapshot errors on restore) - 401 bad or
missing API key - 404 unknown model / route / file - 409 slot busy -
408 body not received in time - 413 body too large - 429 overloaded - 499 the
client left (never sent: counted as a disconnect) - 503 unhealthy or unavailable.
Anything unexpected is a 500 with a generic message: never a traceback.
Every message is clipped to MAX_MESSAGE characters, so an error never echoes
unbounded client input (a 256 MiB file name, a megabyte-long field name).
"""
from __future__ import annotations

from ..errors import (CacheOverflow, ContextOverflow, MuserError, PackError, RequestError,
                      SnapshotError, TokenizerUnavailable)

MAX_MESSAGE = 1000          # characters of an error message (client input is clipped further)


def clip(text, limit: int = 80) -> str:
    """`repr`-free short form of client input for an error message."""
    text = str(text)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


class ServerError(Exception):
    status = 500
    type = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        if len(message) > MAX_MESSAGE:
            message = message[:MAX_MESSAGE] + "... (truncated)"
        super().__init__(message)
        self.message, self.param = message, clip(param, 64) if param is not None else None
        if code is not None:
            self.code = code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


class InvalidRequest(ServerError):
    status, type, code = 400, "invalid_request_error", "invalid_request"


class ContextTooLong(InvalidRequest):
    code = "context_length_exceeded"


class AuthError(ServerError):
    status, type, code = 401, "authentication_error", "invalid_api_key"


class NotFound(ServerError):
    status, type, code = 404, "invalid_request_error", "not_found"


class ModelNotFound(NotFound):
    code = "model_not_found"


class SlotBusy(ServerError):
    status, type, code = 409, "invalid_request_error", "slot_busy"


class RequestTimeout(ServerError):
    status, type, code = 408, "invalid_request_error", "request_timeout"


class ClientGone(ServerError):
    """The client disconnected before its request was read: nobody receives this answer."""
    status, type, code = 499, "invalid_request_error", "client_closed_request"


class PayloadTooLarge(ServerError):
    status, type, code = 413, "invalid_request_error", "payload_too_large"


class Overloaded(ServerError):
    status, type, code = 429, "rate_limit_error", "overloaded"


class Unavailable(ServerError):
    status, type, code = 503, "service_unavailable", "unavailable"


class Internal(ServerError):
    status, type, code = 500, "server_error", "internal_error"


def to_http(exc: BaseException) -> ServerError:
    """The ServerError a raised exception is answered with."""
    if isinstance(exc, ServerError):
        return exc
    if isinstance(exc, ContextOverflow):
        return ContextTooLong(str(exc), param="messages")
    if isinstance(exc, CacheOverflow):            # refused before any write: the request's length
        return ContextTooLong(f"context too long: {exc}")
    if isinstance(exc, (RequestError, PackError, SnapshotError)):
        return InvalidRequest(str(exc), param=getattr(exc, "param", None))
    if isinstance(exc, RecursionError):
        return InvalidRequest("the request is nested too deeply")
    if isinstance(exc, TokenizerUnavailable):
        return InvalidRequest(f"{exc} (send token ids to /v1/completions)")
    if isinstance(exc, MuserError):
        return Unavailable(f"{type(exc).__name__}: {exc}")
    return Internal("internal server error")
