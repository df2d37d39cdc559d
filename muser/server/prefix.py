"""The server's prefix cache: where cuts are recorded, and how a request reuses one.

Owns: `chat_boundaries` (token positions where a chat's system prologue and its completed turns
end, read off the chat template: the conversation is rendered up to a boundary with a probe user
message after it, and the boundary is where that rendering parts from the real one -- no
guessing at template syntax), `cut_points` (those boundaries plus the end of the prompt rounded
down to the store's block size), and `PrefixCache`, the glue between the scheduler and a
`muser.store.CutStore`: a placement peek, an admission that installs the longest stored prefix
(after storing the slot's evicted state), recording a cut when a prefill reaches a cut point,
and the store's figures for /metrics and GET /v1/prefix_cache.
Does not own: the store (muser.store), placement (slots.py) or the prefill loop (scheduler.py,
which splits its chunks at the cut points so the session passes through each of them).

Exactness: a request served through a stored cut computes prefill(prefix) then prefill(suffix)
(the suffix split at its own cut points).  Until every CPU path is chunk-invariant (issue 12)
that is not bit for bit what one uninterrupted prefill computes; after it, it is.
"""
from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections import OrderedDict
from typing import Sequence

from ..errors import MuserError, StoreError

log = logging.getLogger("muser.server")
PROBE = "\u2063"        # an invisible separator as the probe message: no real message starts so
MAX_TURN_CUTS = 4       # boundaries probed per request: the system prologue + the newest turns
MIN_PIECE = 16          # a cut point closer than this past the prefill's start is not split at


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class BoundaryMemo:
    """Boundaries already probed: digest of messages[:k] -> the position where they end.

    Probing renders and tokenizes the conversation once per boundary (~1 ms per 1,000 tokens);
    an agent loop re-sends the same earlier turns every request, so their boundaries are looked
    up instead (measured: 4-6 ms of an 8-turn loop's request).  A stale or foreign entry can only
    place a cut elsewhere in this request's own tokens -- a cut is a prefix of `ids` whatever
    its position -- so it costs reuse, never correctness.  Bounded, least recently used out."""

    def __init__(self, size: int = 4096):
        self.size = size
        self._d: OrderedDict[bytes, int] = OrderedDict()
        self._lock = threading.Lock()             # requests are planned on a thread pool

    def get(self, key: bytes) -> int | None:
        with self._lock:
            b = self._d.get(key)
            if b is not None:
                self._d.move_to_end(key)
            return b

    def put(self, key: bytes, b: int) -> None:
        with self._lock:
            self._d[key] = b
            self._d.move_to_end(key)
            while len(self._d) > self.size:
                self._d.popitem(last=False)


def _prefix_digests(messages: list[dict], variables: dict | None) -> list[bytes]:
    """d[k] = a digest of the template variables and messages[:k] (a hash chain: one pass)."""
    h = hashlib.blake2b(json.dumps(variables or {}, sort_keys=True, default=str).encode(), digest_size=16)
    out = [b""]
    for m in messages:
        h.update(json.dumps(m, sort_keys=True, default=str).encode())
        h.update(b"\x1e")
        out.append(h.copy().digest())
    return out


def chat_boundaries(render, messages: list[dict], ids: Sequence[int],
                    memo: BoundaryMemo | None = None, variables: dict | None = None) -> list[int]:
    """Token positions in `ids` (the rendered `messages`) where the system prologue and each
    completed turn end.  `render(messages, add_generation_prompt)` -> ids.  A boundary the
    template cannot express (a refusal, or a rendering that does not share the prefix) is
    skipped: the cut is only ever a token prefix of `ids`, so a boundary can cost reuse, never
    correctness.  `memo` remembers probed boundaries, keyed by the template `variables` the
    rendering used and the messages up to the boundary."""
    ends = []
    n_sys = 0
    while n_sys < len(messages) and messages[n_sys].get("role") in ("system", "developer"):
        n_sys += 1
    if n_sys:
        ends.append(n_sys)
    for i in range(n_sys + 1, len(messages)):
        if messages[i].get("role") == "user" and messages[i - 1].get("role") != "user":
            ends.append(i)                   # a completed turn ends before the next user message
    ends = ends[:1] + ends[1:][-MAX_TURN_CUTS:] if n_sys else ends[-MAX_TURN_CUTS:]
    digests = _prefix_digests(messages, variables) if memo is not None and ends else None
    out = []
    for k in ends:
        b = memo.get(digests[k]) if digests else None
        if b is None:
            try:
                probe = render(list(messages[:k]) + [{"role": "user", "content": PROBE}], False)
            except Exception:                # noqa: BLE001 -- a template that refuses: no cut here
                continue
            b = _common(probe, ids)
            if digests:
                memo.put(digests[k], b)
        if 0 < b < len(ids) and (not out or b > out[-1]):
            out.append(b)
    return out


def cut_points(n_prompt: int, boundaries: Sequence[int], block_size: int) -> tuple[int, ...]:
    """Where a prefill of `n_prompt` tokens records cuts: the template boundaries and the end of
    the prompt rounded down to the block size (dropped when a boundary already covers it)."""
    points = {b for b in boundaries if 0 < b <= n_prompt}
    end = n_prompt // block_size * block_size
    if end > max(points, default=0):
        points.add(end)
    return tuple(sorted(points))


class PrefixCache:
    """The scheduler's handle on the store.  Placement peeks from the event loop; everything
    else runs on the worker thread (the store's lock makes the mix safe)."""

    def __init__(self, store):
        self.store = store
        self.block_size = store.block_size

    # ------------------------------------------------------------------ event loop
    def peek(self, prompt: Sequence[int]) -> int:
        """Positions a placement of `prompt` could install from the store (0: none)."""
        hit = self.store.longest_prefix(prompt, limit=len(prompt) - 1, record=False)
        return 0 if hit is None else hit.position

    # ------------------------------------------------------------------ worker
    def put(self, session, why: str) -> None:
        """Store the session's cut; a store refusal costs reuse, never the request."""
        try:
            self.store.put(session)
        except StoreError as e:
            log.info("prefix cache: %s cut at %d not stored: %s", why, session.position, e)

    def admit(self, session, prompt: Sequence[int], live: int) -> tuple[int, int]:
        """Prepare `session` for `prompt`: (tokens reused, of which installed from the store).

        `live`: tokens of `prompt` the session already holds (it strictly extends them).  The
        longest stored prefix wins when it is longer; the session's own state is stored first
        (a slot's state when it is evicted).  Without reuse the session is emptied."""
        hit = self.store.longest_prefix(prompt, limit=len(prompt) - 1)
        if hit is not None and hit.position > live:
            if session.position:
                self.put(session, "evicted slot")
            try:
                return self.store.install(session, hit), hit.position
            except MuserError as e:
                # evicted meanwhile, a bad file (logged, removed) or refused by the snapshot gate:
                # the session is unchanged, the prompt is recomputed
                log.warning("prefix cache: installing %d stored tokens failed (%s); recomputing",
                            hit.position, e)
        if live:
            return live, 0
        if session.position:
            self.put(session, "evicted slot")
            session.reset()
        return 0, 0

    def plan_cuts(self, session, cuts: Sequence[int], reuse: int, stored: int) -> tuple:
        """The cut points a prefill from `reuse` splits at.  Every split costs a pass over the
        weights (a piece of 6 tokens: 9 ms, a decode step's worth, on the CPU default), so a cut
        point within MIN_PIECE tokens past the start is dropped -- an agent loop's turn end sits
        a few template tokens past the live reply -- and the start itself is stored instead when
        it is a live slot's state the store does not hold yet (a put, no extra pass)."""
        near = [c for c in cuts if reuse < c < reuse + MIN_PIECE]
        if not near:
            return tuple(cuts)
        if reuse > stored and session.position == reuse:
            self.put(session, "prefill start")
        return tuple(c for c in cuts if c not in near)

    def peer_cut(self, prompt: Sequence[int], have: int, peers) -> tuple | None:
        """Single flight: (peer, position) of the furthest cut a job still prefilling will record
        that is a prefix of `prompt`, at least a block past the `have` tokens this prompt can
        already reuse; None when no peer would save that much.  `peers`: (job, its prompt, its
        cut points, its session's position)."""
        best = None
        for peer, other, cuts, at in peers:
            shared = min(_common(prompt, other), len(prompt) - 1)
            for c in cuts:
                if at < c <= shared and c - have >= self.block_size and (best is None or c > best[1]):
                    best = (peer, c)
        return best

    # ------------------------------------------------------------------ figures
    def stats(self) -> dict:
        return self.store.stats()

    def metric_lines(self, prefix: str) -> list[str]:
        """Prometheus lines: lookups, hits, reused tokens, bytes per tier, evictions, refusals."""
        s = self.store.stats()
        rows = [
            ("prefix_cache_lookups_total", "counter", "prefix-cache lookups (one per admitted request)",
             [("", s["lookups"])]),
            ("prefix_cache_hits_total", "counter", "lookups that found a stored prefix", [("", s["hits"])]),
            ("prefix_cache_reused_tokens_total", "counter", "prompt tokens installed from the store",
             [("", s["installed_tokens"])]),
            ("prefix_cache_bytes", "gauge", "bytes the store holds, by tier",
             [('{tier="ram"}', s["bytes"]["ram"]), ('{tier="disk"}', s["bytes"]["disk"])]),
            ("prefix_cache_budget_bytes", "gauge", "byte budget per tier (-1: unbounded)",
             [('{tier="ram"}', s["budget"]["ram"]),
              ('{tier="disk"}', -1 if s["budget"]["disk"] is None else s["budget"]["disk"])]),
            ("prefix_cache_cuts", "gauge", "stored cuts, by tier",
             [('{tier="ram"}', s["cuts"]["ram"]), ('{tier="disk"}', s["cuts"]["disk"])]),
            ("prefix_cache_evictions_total", "counter", "cuts evicted, by tier",
             [('{tier="ram"}', s["evictions"]["ram"]), ('{tier="disk"}', s["evictions"]["disk"])]),
            ("prefix_cache_puts_total", "counter", "cuts offered to the store", [("", s["puts"])]),
            ("prefix_cache_refused_files_total", "counter",
             "disk-tier files refused (corrupt, truncated, foreign, wrong key) and removed",
             [("", s["corrupt"])]),
            ("prefix_cache_disk_errors_total", "counter", "failed disk writes (the tier degrades to RAM)",
             [("", s["disk_errors"])]),
        ]
        lines = []
        for name, kind, help_, values in rows:
            lines += [f"# HELP {prefix}{name} {help_}", f"# TYPE {prefix}{name} {kind}"]
            lines += [f"{prefix}{name}{lab} {v:g}" for lab, v in values]
        return lines
