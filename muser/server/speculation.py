"""Speculative decoding inside the server: prompt-lookup drafts verified in one block.

Owns: `SpecStep` -- for one choice whose context suggests a continuation, draft up to
block-1 tokens from its own context (prompt lookup), cut them at the first token the
choice's grammar refuses, verify [pending, drafts] in one `extend` under a cache
checkpoint, accept through the choice's `TokenPicker` (controls, grammar, logprobs,
sampling -- the same pipeline as a plain step; the matcher and penalty history roll back
over rejected drafts), and roll the cache back to the kept tokens.  Returns the settled
picks; the scheduler emits them one by one exactly as decoded tokens.  `verify`: every
drafted choice of a round in one forward where the engine's rows are exact and shared
passes cheaper (the CPU int8 path), else one forward each.
Does not own: draft search (engine/speculative.py) or the acceptance rule (engine/picker.py).
"""
from __future__ import annotations

from ..engine.speculative import DraftGate, PromptLookupDrafter
from .job import SAFE_ERRORS


class SpecStep:
    def __init__(self, block: int, cost: float = 1.0):
        self.block = block
        self.cost = cost                  # a block's cost in decode steps (Engine.verify_cost)
        self.drafter = PromptLookupDrafter()

    def drafts(self, c, room: int) -> list[int]:
        """Drafts for choice `c` (pending token not yet consumed); [] when nothing is proposed,
        or while the choice's recent blocks settled fewer tokens than a block costs
        (DraftGate).  `room`: tokens the choice may still take after its pending one."""
        k = max(0, min(self.block - 1, room))
        if k == 0:
            return []
        if c.draft_gate is None:
            c.draft_gate = DraftGate(self.cost, self.block)
        if not c.draft_gate.wants():
            return []
        found, _ = self.drafter.draft(c.session.tokens + [c.pending], k, c.picker.params)
        return c.picker.usable_drafts(found[:k], sampled_drafts=False)

    def verify(self, engine, items: list) -> list:
        """Verify every (choice, drafts) of `items`: all in one forward where
        `engine.shared_chunks` (each row bitwise what its own block gives, the weights read once),
        else one forward each.  Per item its picks, or the SAFE error its picker raised."""
        groups = [items] if engine.shared_chunks else [[it] for it in items]
        return [res for group in groups for res in self.verify_group(engine, group)]

    @staticmethod
    def verify_group(engine, items: list) -> list:
        """[pending] + drafts of every (choice, drafts) in one forward under a checkpoint each;
        per item its picks, or the error its picker raised (SAFE_ERRORS: that choice's block
        rolled back whole, the others settled).  A failed forward rolls every block back."""
        sessions, cps = [c.session for c, _ in items], []
        try:
            for s, (_, drafts) in zip(sessions, items):
                cps.append(s.checkpoint(1 + len(drafts)))
            rows = engine.forward(sessions, [[c.pending] + d for c, d in items], all_logits=True)
        except BaseException:
            for s, cp in zip(sessions, cps):
                s.rollback(cp, keep=0)
            raise
        out, at = [], 0
        for (c, drafts), cp in zip(items, cps):
            n = 1 + len(drafts)
            try:
                out.append(_settle_block(c, cp, rows[at:at + n], drafts))
            except SAFE_ERRORS as e:
                out.append(e)
            at += n
        return out


def _settle_block(c, cp, rows, drafts: list[int]):
    """Accept through the choice's picker and keep pending + the accepted drafts; a picker that
    raises leaves the block rolled back whole (the checkpoint is never left open)."""
    try:
        picks = c.picker.verify(rows, drafts)
    except BaseException:
        c.session.rollback(cp, keep=0)
        raise
    c.session.rollback(cp, keep=len(picks))
    return picks
