"""The JSON bodies the server sends: OpenAI completions, chunks, usage, errors.

Owns: the dict shapes of a chat / text completion (whole and as a stream
chunk), the usage block (with prompt_tokens_details.cached_tokens), response
ids and the error body -- plain functions of their fields.  Does not own:
validating requests (schemas.py), turning a job's events into these bodies
(responses.py, stream_shape.py) or HTTP status codes (http_errors.py).
"""
from __future__ import annotations

import time
import uuid


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt: int, completion: int, cached: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def chat_response(rid: str, model: str, choices: list[dict], use: dict, ext: dict) -> dict:
    """`choices`: [{"index", "message", "finish_reason", "logprobs"}] (see responses.py)."""
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": use, "system_fingerprint": None, "muser": ext}


def chat_chunk(rid: str, model: str, delta: dict, finish: str | None, ext: dict | None = None,
               use: dict | None = None, empty: bool = False, index: int = 0,
               logprobs: dict | None = None, created: int | None = None) -> dict:
    """`created`: the stream's (every chunk of a stream carries the same, as OpenAI's)."""
    out = {"id": rid, "object": "chat.completion.chunk",
           "created": int(time.time()) if created is None else created,
           "model": model, "system_fingerprint": None,
           "choices": [] if empty else [{"index": index, "delta": delta, "finish_reason": finish,
                                         "logprobs": logprobs}]}
    if use is not None:
        out["usage"] = use
    if ext is not None:
        out["muser"] = ext
    return out


def completion_response(rid: str, model: str, choices: list[dict], use: dict, ext: dict) -> dict:
    """`choices`: [{"index", "text", "finish_reason", "logprobs"}]."""
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": use, "system_fingerprint": None, "muser": ext}


def completion_chunk(rid: str, model: str, text: str, finish: str | None, ext: dict | None = None,
                     use: dict | None = None, empty: bool = False, index: int = 0,
                     logprobs: dict | None = None, created: int | None = None) -> dict:
    out = {"id": rid, "object": "text_completion",
           "created": int(time.time()) if created is None else created, "model": model,
           "system_fingerprint": None,
           "choices": [] if empty else [{"index": index, "text": text, "finish_reason": finish,
                                         "logprobs": logprobs}]}
    if use is not None:
        out["usage"] = use
    if ext is not None:
        out["muser"] = ext
    return out


def error_body(message: str, type_: str, code: str | None = None, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
