"""Speculative decoding over transactional cache checkpoints.

Owns: the drafters (prompt lookup, draft model; `make_drafter` loads a draft
model once, for the caller to pass to every generation), the
verify-accept-rollback round, and speculative sampling.  Does not own: how a
rollback restores rows (muser.cache.checkpoint) -- a round never copies the
cache.

One round, with `t` the token sampled last round and not yet consumed:

    drafts   d1 .. dk             (drafter; the draft model decodes them)
    verify   cp = target.checkpoint(k + 1)
             L = target.extend([t, d1, .., dk])    L[i] = distribution after token i
             (no drafts, exact rows: L = [target.decode(t)], no checkpoint -- the same bits)
    accept   greedy:   d(i+1) kept while argmax L[i] == d(i+1)
             sampling: kept with prob min(1, p/q), else resample from norm(max(0, p - q))
    commit   target.rollback(cp, keep = 1 + accepted)  (t is always kept)
    next t   the correction (or, all accepted, the bonus sampled from L[k])

The block [t, d1..dk] is at most `block` <= 16 tokens.  A block on a full ring
wraps; `extend` stages it (attend before overwrite), and the checkpoint holds
at most block rows per ring plane.
"""
from __future__ import annotations

from typing import Iterator

import torch

from ..errors import RequestError
from .sampling import SamplingParams, probs, sample

MAX_BLOCK = 16
DEFAULT_BLOCK = 8


class DraftGate:
    """Whether a round drafts at all: only while recent drafted rounds settled at least `cost`
    tokens each (a block costs `cost` decode steps: Engine.verify_cost), probing every
    PROBE-th round when they did not.  Deterministic -- acceptance history only, never time --
    and it changes no token: where rows are exact a round without drafts is a plain decode
    step with the same bits.  Worked example, cost 3: rounds settle 2, 1 -> history 8, 5, 3
    (halves toward each round) -> the next round drafts (3 >= 3); one more 1 -> 2: no drafts
    for 7 rounds, the 8th probes."""

    PROBE = 8

    def __init__(self, cost: float, block: int):
        self.cost = cost
        self.history = float(block)          # optimistic: the first rounds draft
        self.idle = 0

    def wants(self) -> bool:
        if self.history >= self.cost:
            return True
        self.idle += 1
        if self.idle >= self.PROBE:
            self.idle = 0
            return True
        return False

    def record(self, settled: int) -> None:
        """A drafted round settled `settled` tokens (accepted drafts + the correction)."""
        self.history = 0.5 * self.history + 0.5 * settled


class PromptLookupDrafter:
    """Propose what followed the most recent earlier occurrence of the current suffix."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def draft(self, context: list[int], k: int, params: SamplingParams):
        if k <= 0:
            return [], None
        for n in range(min(self.max_ngram, len(context) - 1), self.min_ngram - 1, -1):
            suffix = context[-n:]
            # Scan right to left: the most recent earlier occurrence wins.
            for i in range(len(context) - n - 1, -1, -1):
                if context[i:i + n] == suffix:
                    follow = context[i + n:i + n + k]
                    if follow:
                        return follow, None          # a point mass: q(d) = 1
        return [], None

    def sync(self, context: list[int]) -> None:
        pass


class DraftModelDrafter:
    """A smaller model sharing the target's tokenizer, with its own session and checkpoints."""

    def __init__(self, engine):
        self.engine = engine
        self.session = engine.new_session()
        self.cp = None
        self._gen = None                 # the round's generator (set by speculative_generate)
        # The calls whose rows the draft cache holds, e.g. [("prefill", [..]), ("decode", 7)]:
        # replaying them on a fresh session must give the same cache bit for bit.
        self.trace: list[tuple[str, object]] = []

    def draft(self, context: list[int], k: int, params: SamplingParams):
        s = self.session
        if k <= 0:
            return [], None
        # Bring the draft session up to the context (it may lag by a few tokens).
        if s.tokens != context[:len(s.tokens)] or len(s.tokens) >= len(context):
            s.reset()
            self.trace = []
        missing = context[len(s.tokens):]
        logits = s.prefill(missing)
        self.trace.append(("prefill", list(missing)))
        self.cp = s.checkpoint(k)
        self.base = s.position
        drafts, qs = [], []
        gen = self._gen
        for i in range(k):
            q = probs(logits, params)
            d = int(torch.argmax(q)) if params.greedy else int(torch.multinomial(q, 1, generator=gen))
            drafts.append(d)
            qs.append(q)
            if i + 1 < k:
                logits = s.decode(d)
                self.trace.append(("decode", d))
        return drafts, qs

    def sync(self, context: list[int]) -> None:
        """Keep only the drafts the target accepted (a rollback, never a copy)."""
        if self.cp is None:
            return
        toks = self.session.tokens
        agree = 0
        while (self.base + agree < len(toks) and self.base + agree < len(context)
               and toks[self.base + agree] == context[self.base + agree]):
            agree += 1
        self.session.rollback(self.cp, keep=agree)
        self.cp = None
        # Drop the decode calls of rejected drafts from the trace (they come last).
        while self.trace and self.trace[-1][0] == "decode" and self.session.position < self._trace_end():
            self.trace.pop()

    def _trace_end(self) -> int:
        return sum(len(arg) if kind == "prefill" else 1 for kind, arg in self.trace)


def make_drafter(spec: str, engine):
    """`prompt-lookup` or `draft:MODEL` (a model sharing `engine`'s vocabulary, loaded here, once:
    the drafter keeps its session and is reused by every generation it is passed to)."""
    if spec == "prompt-lookup":
        return PromptLookupDrafter()
    if spec.startswith("draft:"):
        from .loader import load
        draft = load(spec[len("draft:"):], device=engine.config.device, dtype=engine.config.dtype,
                     progress=False)
        if draft.spec.vocab_size != engine.spec.vocab_size:
            raise RequestError(f"draft model vocabulary expected {engine.spec.vocab_size} "
                               f"(the target's), got {draft.spec.vocab_size}")
        return DraftModelDrafter(draft)
    raise RequestError(f"speculative must be 'prompt-lookup' or 'draft:MODEL', got {spec!r}")


def _accept(target_logits: torch.Tensor, drafts: list[int], qs, params: SamplingParams,
            gen: torch.Generator) -> tuple[int, int]:
    """(accepted count, next token).  target_logits [k + 1, vocab]."""
    for i, d in enumerate(drafts):
        if params.greedy:
            best = int(torch.argmax(target_logits[i]))
            if best != d:
                return i, best
            continue
        p = probs(target_logits[i], params)
        q_d = 1.0 if qs is None else float(qs[i][d])
        if float(torch.rand((), generator=gen)) < min(1.0, float(p[d]) / max(q_d, 1e-30)):
            continue
        residual = p.clone()
        if qs is None:
            residual[d] = 0.0
        else:
            residual = torch.clamp(p - qs[i], min=0.0)
        total = float(residual.sum())
        if total <= 0.0:                       # p == q: any draw from p is exact
            residual = p
        return i, int(torch.multinomial(residual / residual.sum(), 1, generator=gen))
    return len(drafts), sample(target_logits[len(drafts)], params, gen)


def drafter_for(spec) -> "PromptLookupDrafter | DraftModelDrafter":
    """The drafter a generation uses: a drafter object as given, `prompt-lookup` (stateless, built
    here); a `draft:MODEL` string is refused -- loading a model per call is the caller's cost to
    pay once (`make_drafter`)."""
    if isinstance(spec, (PromptLookupDrafter, DraftModelDrafter)):
        return spec
    if spec == "prompt-lookup":
        return PromptLookupDrafter()
    if isinstance(spec, str) and spec.startswith("draft:"):
        raise RequestError(f"speculative={spec!r}: load the draft model once with "
                           "muser.engine.make_drafter(spec, engine) and pass the drafter")
    raise RequestError(f"speculative must be 'prompt-lookup' or a drafter, got {spec!r}")


def speculative_generate(engine, session, ids: list[int], max_tokens: int, params: SamplingParams,
                         spec, block: int | None, stats: dict | None,
                         picker=None) -> Iterator[int]:
    """With a `picker` (picker.py), every token -- the first, each verified draft, each
    correction -- goes through its controls and grammar: drafts are cut at the first token the
    grammar refuses, and the picker's matcher rolls back over rejected drafts with the cache."""
    block = DEFAULT_BLOCK if block is None else block
    if not 1 <= block <= MAX_BLOCK:
        raise RequestError(f"block must be in [1, {MAX_BLOCK}], got {block}")
    drafter = drafter_for(spec)
    if isinstance(drafter, DraftModelDrafter) and drafter.engine.spec.vocab_size != engine.spec.vocab_size:
        raise RequestError(f"draft model vocabulary expected {engine.spec.vocab_size} "
                           f"(the target's), got {drafter.engine.spec.vocab_size}")
    stats = stats if stats is not None else {}
    stats.update(drafted=0, accepted=0, forwards=0, emitted=0, rounds=0)
    if max_tokens == 0:
        return
    eos = set(engine.spec.eos_token_ids) | (picker.end_ids if picker is not None else set())
    gen = params.generator()
    if isinstance(drafter, DraftModelDrafter):
        drafter._gen = gen
    if picker is not None:
        gen = picker.gen
        if isinstance(drafter, DraftModelDrafter):
            drafter._gen = gen
    logits = session.prefill(ids)
    stats["forwards"] += 1
    plain_ok = engine.exact_rows          # a decode step == a 1-row verification block, bitwise
    gate = DraftGate(engine.verify_cost, block)
    t = sample(logits, params, gen) if picker is None else picker.pick(logits).token
    settled = [t]              # sampled, not yet emitted; the last one is not yet consumed
    emitted = 0
    k_max = block - 1
    k = k_max
    while True:
        for tok in settled:
            if tok in eos:
                return
            yield tok
            emitted += 1
            stats["emitted"] = emitted
            if emitted >= max_tokens:
                return
        if picker is not None and picker.stopped:       # (its state is after every settled token)
            return
        k_now = max(0, min(k, max_tokens - emitted - 1, engine.max_context - session.position - 1))
        context = session.tokens + [t]
        if gate.wants():
            drafts, qs = drafter.draft(context, k_now, params)
        else:
            drafts, qs = [], None
            stats["idle_rounds"] = stats.get("idle_rounds", 0) + 1
        drafts = drafts[:k_now]
        if picker is not None:
            drafts = picker.usable_drafts(drafts, qs is not None)
        if drafts or not plain_ok:
            cp = session.checkpoint(1 + len(drafts))
            try:
                out = session.extend([t] + drafts)              # [1 + k, vocab]
            except BaseException:
                session.rollback(cp, keep=0)
                drafter.sync(session.tokens)  # the drafter outlives this call: close its round
                raise
        else:
            # nothing to verify, and rows are exact: a plain decode step -- the bits of a 1-row
            # block (one arithmetic per token) without the checkpoint and the chunk pass (on
            # CUDA the decode graph: ~1.4 ms where a 1-row verification block took 6.6 on the 1B)
            cp = None
            out = session.decode(t)[None]                       # [1, vocab]
            stats["plain_steps"] = stats.get("plain_steps", 0) + 1
        stats["forwards"] += 1
        stats["rounds"] += 1
        if picker is None:
            accepted, nxt = _accept(out, drafts, qs, params, gen)
        else:
            picks = picker.verify(out, drafts, qs)
            accepted, nxt = len(picks) - 1, picks[-1].token
        if cp is not None:
            stats["max_retained_rows"] = max(stats.get("max_retained_rows", 0),
                                             *cp.retained_rows(), 0)
            session.rollback(cp, keep=1 + accepted)
        stats.setdefault("kept_blocks", []).append([t] + drafts[:accepted])
        drafter.sync(session.tokens)
        if drafts:
            gate.record(1 + accepted)
        stats["drafted"] += len(drafts)
        stats["accepted"] += accepted
        stats["acceptance"] = stats["accepted"] / max(1, stats["drafted"])
        # Tokens settled per target forward: accepted drafts plus the correction/bonus.
        stats["tokens_per_forward"] = (stats["accepted"] + stats["rounds"]) / max(1, stats["rounds"])
        k = min(k_max, k + 2) if accepted == len(drafts) else max(1, accepted + 1)
        settled = drafts[:accepted] + [nxt]
        t = nxt
