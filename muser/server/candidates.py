"""A request's prompt turned into slot candidates: what each slot would prefill to serve it.

Owns: rendering a chat (template refusals -> 400), tokenizing or checking a raw prompt, the
context plan (policy.py: the fresh plan, or a plan that continues a slot's shifted lineage, by
slot) and the prefix-cache cut points of a prompt prefilled in place.  A candidate is built per
slot on demand and shared between slots that would prefill the same rows:

    chat(messages) -> (candidate(slot), fresh plan)      raw(prompt) -> (candidate(slot), tokens)

Does not own: the gates before (admission.py: message count, size), placing a candidate in a
slot (slots.py) or running it (scheduler.py).
"""
from __future__ import annotations

import logging
from typing import Any, Callable

from ..errors import RequestError
from .admission import PromptGate
from .http_errors import InvalidRequest
from .policy import Limits, ReplayPlan, match_lineage, plan_chat
from .raw_policy import RawReplay, plan_raw, plan_raw_continuation
from .prefix import BoundaryMemo, PrefixCache, chat_boundaries, cut_points
from .slots import Candidate, Slot
from .text import SharedTokenizer

log = logging.getLogger("muser.server")


class Prompts:
    """The server's prompt planner (called on worker threads: `asyncio.to_thread`).
    `boundaries` memoizes the chat boundaries probed; BoundaryMemo locks itself."""

    def __init__(self, tokenizer: SharedTokenizer, gate: PromptGate, limits: Limits,
                 prefix: PrefixCache | None, bos: int | None, vocab: int):
        self.tokenizer, self.gate, self.limits, self.prefix = tokenizer, gate, limits, prefix
        self.bos, self.vocab = bos, vocab
        self.boundaries = BoundaryMemo()

    def render_chat(self, messages: list[dict], variables: dict | None = None,
                    generation: bool = True) -> list[int]:
        try:
            ids = self.tokenizer.apply_chat_template(messages, generation, variables)
        except RequestError:
            raise
        except Exception as e:             # noqa: BLE001 -- a template's refusal is a bad request
            raise InvalidRequest(f"the chat template refused these messages: {e}") from None
        return list(ids)

    def chat(self, messages: list[dict], variables: dict | None = None
             ) -> tuple[Callable[[Slot], Candidate], Any]:
        """`variables`: the request's chat-template variables (`reasoning_effort`)."""
        messages = self.gate.chat_messages(messages)
        self.gate.check_size(messages=messages)
        rendered: dict[tuple, list[int]] = {}

        def render(ms: list[dict]) -> list[int]:
            key = tuple(id(m) for m in ms)
            if key not in rendered:
                rendered[key] = self.render_chat(list(ms), variables)
            return rendered[key]

        count = lambda ms: len(render(ms))           # noqa: E731
        fresh = plan_chat(messages, count, self.limits)
        log.info("chat plan: %s", fresh.reason)
        ids = render(fresh.messages())
        fresh_c = Candidate(ids, fresh, fresh.shifted, cuts=self._chat_cuts(fresh, ids, variables))
        by_start: dict[int, Candidate] = {}

        def candidate(slot: Slot) -> Candidate:
            r = slot.replay
            if isinstance(r, ReplayPlan) and self.limits.policy == "shift":
                j = match_lineage(r, messages)
                if j:
                    if j not in by_start:
                        p = plan_chat(messages, count, self.limits, start=j)
                        by_start[j] = Candidate(render(p.messages()), p, True, lineage=True)
                    return by_start[j]
            return fresh_c
        return candidate, fresh

    def _chat_cuts(self, plan, ids: list[int], variables: dict | None = None) -> tuple:
        """Prefix-cache cut points of a chat prompt that is prefilled in place (not shifted)."""
        if self.prefix is None or plan.shifted:
            return ()
        render = lambda ms, gen: self.tokenizer.apply_chat_template(ms, gen, variables)  # noqa: E731
        return cut_points(len(ids), chat_boundaries(render, list(plan.messages()), ids,
                                                    self.boundaries, variables),
                          self.prefix.block_size)

    def _raw_cuts(self, plan, n: int) -> tuple:
        if self.prefix is None or plan.shifted:
            return ()
        return cut_points(n, (), self.prefix.block_size)

    def raw(self, prompt: str | list[int]) -> tuple[Callable[[Slot], Candidate], list[int]]:
        if isinstance(prompt, str):
            self.gate.check_size(text=prompt)
            tokens = self.tokenizer.encode(prompt)
        else:
            tokens = list(prompt)
            vocab = self.vocab
            bad = [t for t in tokens if not 0 <= t < vocab]
            if bad:
                raise InvalidRequest(f"prompt token ids must be in [0, {vocab}), got {bad[:5]}",
                                     param="prompt")
        if not tokens:
            raise InvalidRequest("the prompt encodes to no tokens", param="prompt")
        pinned = 1 if self.bos is not None and tokens[0] == self.bos else 0
        fresh = plan_raw(len(tokens), self.limits, pinned)
        log.info("raw plan: %s", fresh.reason)
        kept = fresh.apply(tokens)
        fresh_c = Candidate(kept, fresh, fresh.shifted, cuts=self._raw_cuts(fresh, len(kept)))

        def candidate(slot: Slot) -> Candidate:
            r = slot.replay
            if isinstance(r, RawReplay) and self.limits.policy == "shift":
                c = plan_raw_continuation(tokens, self.limits, r, pinned)
                if c is not None:
                    return Candidate(c.apply(tokens), c, True, lineage=True)
            return fresh_c
        return candidate, tokens
