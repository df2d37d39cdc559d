"""Server metrics in the Prometheus text exposition format (no client library).

Owns: thread-safe counters and summaries (sum + count) that the app and the
worker bump, gauges read at scrape time, and rendering `/metrics`.
Does not own: deciding what happened (callers report it).
"""
from __future__ import annotations

import threading
from typing import Callable

HELP = {
    "requests_total": ("counter", "HTTP requests by endpoint and status"),
    "prompt_tokens_total": ("counter", "prompt tokens of served requests"),
    "cached_tokens_total": ("counter", "prompt tokens served from a live cache or the prefix cache"),
    "prefill_tokens_total": ("counter", "prompt tokens actually prefilled"),
    "completion_tokens_total": ("counter", "tokens sampled"),
    "cache_hits_total": ("counter", "requests that reused a live cache or a stored prefix"),
    "draft_tokens_total": ("counter", "speculative draft tokens verified"),
    "accepted_draft_tokens_total": ("counter", "speculative draft tokens accepted"),
    "context_shifts_total": ("counter", "context shifts (staging rebuilds published)"),
    "disconnects_total": ("counter", "requests whose client left (mid-upload, queued or streaming)"),
    "request_failures_total": ("counter", "requests failed alone (their own sampling / text), pool kept"),
    "model_failures_total": ("counter", "model steps that raised (each latches the pool)"),
    "prefix_cache_waits_total": ("counter", "requests that waited for a peer's cut (single flight)"),
    "steps_ahead_total": ("counter", "decode steps launched before the last was read (--pipeline)"),
    "steps_taken_back_total": ("counter", "steps a choice that ended had taken ahead, given back"),
    "queue_wait_seconds": ("summary", "time a request waited for a slot"),
    "prefill_seconds": ("summary", "time of one admission prefill"),
    "decode_seconds": ("summary", "time of one decode round (all active slots)"),
    "ttft_seconds": ("summary", "time from request to first token"),
}


def _labels(labels: dict | None) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{str(v)}"'.replace("\n", " ") for k, v in sorted(labels.items()))
    return "{" + inner + "}"


class Metrics:
    def __init__(self, prefix: str = "muser_"):
        self.prefix = prefix
        self._lock = threading.Lock()
        self._counters: dict[tuple[str, str], float] = {}
        self._summaries: dict[str, list[float]] = {}
        self._gauges: dict[str, tuple[str, Callable[[], float]]] = {}
        self._collectors: list[Callable[[str], list[str]]] = []

    def inc(self, name: str, value: float = 1.0, labels: dict | None = None) -> None:
        key = (name, _labels(labels))
        with self._lock:
            self._counters[key] = self._counters.get(key, 0.0) + value

    def observe(self, name: str, value: float) -> None:
        with self._lock:
            s = self._summaries.setdefault(name, [0.0, 0.0])
            s[0] += value
            s[1] += 1

    def gauge(self, name: str, help_: str, read: Callable[[], float]) -> None:
        self._gauges[name] = (help_, read)

    def collector(self, lines: Callable[[str], list[str]]) -> None:
        """`lines(prefix)` -> ready exposition lines (HELP, TYPE, samples), read at scrape time."""
        self._collectors.append(lines)

    def value(self, name: str, labels: dict | None = None) -> float:
        with self._lock:
            return self._counters.get((name, _labels(labels)), 0.0)

    def render(self) -> str:
        lines: list[str] = []
        with self._lock:
            counters = dict(self._counters)
            summaries = {k: list(v) for k, v in self._summaries.items()}
        names = sorted({n for n, _ in counters} | set(summaries) | set(HELP))
        for name in names:
            kind, help_ = HELP.get(name, ("counter", name))
            full = self.prefix + name
            lines.append(f"# HELP {full} {help_}")
            lines.append(f"# TYPE {full} {kind}")
            if kind == "summary":
                total, count = summaries.get(name, [0.0, 0.0])
                lines.append(f"{full}_sum {total:.6f}")
                lines.append(f"{full}_count {int(count)}")
            else:
                rows = [(lab, v) for (n, lab), v in counters.items() if n == name]
                for lab, v in sorted(rows) or [("", 0.0)]:
                    lines.append(f"{full}{lab} {v:g}")
        for name, (help_, read) in sorted(self._gauges.items()):
            full = self.prefix + name
            try:
                v = float(read())
            except Exception:              # noqa: BLE001 -- a scrape never fails
                continue
            lines += [f"# HELP {full} {help_}", f"# TYPE {full} gauge", f"{full} {v:g}"]
        for collect in self._collectors:
            try:
                lines += collect(self.prefix)
            except Exception:              # noqa: BLE001 -- a scrape never fails
                continue
        return "\n".join(lines) + "\n"
