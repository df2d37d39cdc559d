"""Speculative decoding inside the server: prompt-lookup drafts verified in one block.

Owns: `SpecStep` -- for one choice whose context suggests a continuation, draft up to
block-1 tokens from its own context (prompt lookup), cut them at the first token the
choice's grammar refuses, verify [pending, drafts] in one `extend` under a cache
checkpoint, accept through the choice's `TokenPicker` (controls, grammar, logprobs,
sampling -- the same pipeline as a plain step; the matcher and penalty history roll back
over rejected drafts), and roll the cache back to the kept tokens.  Returns the settled
picks; the scheduler emits them one by one exactly as decoded tokens.
Does not own: draft search (engine/speculative.py) or the acceptance rule (engine/picker.py).
"""
from __future__ import annotations

from ..engine.speculative import PromptLookupDrafter


class SpecStep:
    def __init__(self, block: int):
        self.block = block
        self.drafter = PromptLookupDrafter()

    def drafts(self, c, room: int) -> list[int]:
        """Drafts for choice `c` (pending token not yet consumed); [] when nothing is proposed.
        `room`: tokens the choice may still take after its pending one."""
        k = max(0, min(self.block - 1, room))
        if k == 0:
            return []
        found, _ = self.drafter.draft(c.session.tokens + [c.pending], k, c.picker.params)
        return c.picker.usable_drafts(found[:k], sampled_drafts=False)

    @staticmethod
    def run(c, drafts: list[int]):
        """Verify [pending] + drafts on the choice's session; the picks it settles."""
        s = c.session
        cp = s.checkpoint(1 + len(drafts))
        try:
            rows = s.extend([c.pending] + drafts)          # [1 + k, vocab]
        except BaseException:
            s.rollback(cp, keep=0)
            raise
        picks = c.picker.verify(rows, drafts)
        s.rollback(cp, keep=len(picks))                   # pending + the accepted drafts
        return picks
