"""POST /tokenize and /detokenize: the server's own tokenizer, as vLLM's and llama.cpp's servers
offer it -- so a client counts tokens exactly as this server bills them.

Owns: what the two endpoints answer.  A prompt is encoded as /v1/completions encodes it (the
BOS with `add_special_tokens`); messages are rendered as /v1/chat/completions renders a chat
that fits (the same template, the same system-only rule), whole -- no context planning, so the
count may exceed `max_model_len`, which is returned beside it.  Ids decode with special tokens
kept, as the completions echo does.
Does not own: auth, body limits and model checks (service.ServerState), routing (app.py).
"""
from __future__ import annotations

from . import tools as toolkit
from .http_errors import InvalidRequest


def tokenize(state, req) -> dict:
    tok = state.tokenizer
    if req.prompt is not None:
        ids = tok.encode(req.prompt, add_bos=req.add_special_tokens)
    else:
        messages = state.gate.chat_messages(toolkit.render_messages(req.messages, None))
        ids = state.prompts.render_chat(messages, None, req.add_generation_prompt)
    out = {"count": len(ids), "max_model_len": state.max_context, "tokens": ids}
    if req.return_token_strs:
        out["token_strs"] = [tok.decode([i]) for i in ids]
    return out


def detokenize(state, req) -> dict:
    vocab = state.engine.spec.vocab_size
    bad = [t for t in req.tokens if t >= vocab]
    if bad:
        raise InvalidRequest(f"token ids must be in [0, {vocab}), got {bad[:5]}", param="tokens")
    return {"prompt": state.tokenizer.decode(req.tokens)}
