"""What a prompt must satisfy before it is planned: message count, system-only chats, size.

Owns: `PromptGate` -- the cap on chat messages per request, how a chat made of
system messages only is rendered (with its content, never silently dropped:
Gemma's template folds system content into the first user turn and drops it
when there is none, so such a chat gets an empty user turn; a template that
keeps a lone system message is used as is), and refusing a prompt whose size
alone proves it cannot fit, before it is tokenized.  Does not own: the context
policy (policy.py), tokenizing (text.py) or serving (service.py).
"""
from __future__ import annotations

import logging

from .http_errors import ContextTooLong, InvalidRequest
from .policy import SYSTEM_ROLES, Limits, split_chat
from .text import min_tokens

log = logging.getLogger("muser.server")


class PromptGate:
    def __init__(self, tokenizer, limits: Limits, max_messages: int, chars_per_token: int | None):
        self.tokenizer, self.limits = tokenizer, limits
        self.max_messages, self.chars_per_token = max_messages, chars_per_token
        self.lone_system = self._probe_lone_system()

    def chat_messages(self, messages: list[dict]) -> list[dict]:
        """The messages to plan: a system-only chat gets an empty user turn when the template
        would otherwise drop the system content (Gemma's folds system into the first user turn).
        At most `max_messages`: planning renders the conversation a few times, and 100k tiny
        messages (3.6 MB) took 16 s of interpreter time that every stream would share."""
        if len(messages) > self.max_messages:
            raise InvalidRequest(f"too many messages: {len(messages):,}, this server takes at most "
                                 f"{self.max_messages:,} per request", param="messages")
        if not messages or any(m["role"] not in SYSTEM_ROLES for m in messages):
            return messages
        if self.lone_system == "kept":
            return messages
        if self.lone_system == "needs_user":
            log.info("system-only chat: served as the first user turn (this chat template drops "
                     "a system message that no user message follows)")
            return [*messages, {"role": "user", "content": ""}]
        raise InvalidRequest("this model's chat template drops system content that no user "
                             "message follows: add a user message", param="messages")

    def _probe_lone_system(self) -> str:
        """How this template treats a chat of system messages only: kept | needs_user | dropped."""
        mark = "muser-probe-7f3a"
        try:
            alone = self.tokenizer.render_chat([{"role": "system", "content": mark}])
            if mark in alone:
                return "kept"
            with_user = self.tokenizer.render_chat([{"role": "system", "content": mark},
                                                    {"role": "user", "content": ""}])
            return "needs_user" if mark in with_user else "dropped"
        except Exception:                  # noqa: BLE001 -- no template / refusal: let requests say
            return "kept"

    def check_size(self, messages: list[dict] | None = None, text: str | None = None) -> None:
        """Refuse, before tokenizing, a prompt whose size alone proves it cannot fit.

        One token covers at most `chars_per_token` characters, so C characters
        are at least ceil(C / chars_per_token) tokens.  What must fit: under
        `error`, everything; under `shift`, the system content and the newest
        turn of a chat (a raw prompt is cut to its newest tokens instead).
        """
        bound, lim = self.chars_per_token, self.limits
        if not bound:
            return
        if messages is not None:
            split = split_chat(messages)
            kept = list(split.system) + [m for t in (split.turns if lim.policy == "error"
                                                     else split.turns[-1:]) for m in t]
            what = ("the conversation" if lim.policy == "error"
                    else "the system content and the newest turn")
            chars = sum(len(m.get("content") or "") for m in kept)
        elif text is not None and lim.policy == "error":
            what, chars = "the prompt", len(text)
        else:
            return
        least = min_tokens(chars, bound)
        if least > lim.budget:
            raise ContextTooLong(
                f"context too long: {what} has {chars:,} characters, so at least {least:,} "
                f"tokens (one token covers at most {bound} characters); the prompt budget is "
                f"{lim.budget:,} tokens (max_context {lim.max_context:,} - output reserve "
                f"{lim.output_reserve:,}); refused before tokenizing",
                param="messages" if messages is not None else "prompt")
