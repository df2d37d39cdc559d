"""Merging the replicas' Prometheus texts into one: per replica, and summed.

Owns: `merge({replica: text}, extra)` -- every sample of every replica comes
out once with a `replica="<name>"` label added, and once more without it,
summed over the replicas (counters, summaries' _sum/_count and gauges alike:
for the gauges muser exports -- slots, busy, queued, healthy -- the sum is the
fleet's total).  HELP/TYPE lines are written once per metric.  `extra` is the
ingress's own text, appended as is.  Does not own: producing metrics
(muser.server.metrics) or fetching them (ingress.py).
"""
from __future__ import annotations

import re
from collections import OrderedDict

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def _base(name: str, families: dict) -> str:
    for suffix in ("_sum", "_count", "_bucket"):
        if name.endswith(suffix) and name[:-len(suffix)] in families:
            return name[:-len(suffix)]
    return name


def _with_label(labels: str | None, key: str, value: str) -> str:
    inner = (labels or "{}")[1:-1]
    add = f'{key}="{value}"'
    return "{" + (inner + "," + add if inner else add) + "}"


def merge(texts: dict[str, str], extra: str = "") -> str:
    meta: "OrderedDict[str, list[str]]" = OrderedDict()        # family -> HELP/TYPE lines
    per: "OrderedDict[str, list[str]]" = OrderedDict()         # family -> labelled samples
    total: "OrderedDict[tuple[str, str, str], float]" = OrderedDict()
    for replica, text in sorted(texts.items()):
        for line in text.splitlines():
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                family = line.split()[2]
                lines = meta.setdefault(family, [])
                if line not in lines:
                    lines.append(line)
                continue
            m = SAMPLE.match(line.strip())
            if not m:
                continue
            name, labels, value = m.group(1), m.group(2), m.group(3)
            try:
                v = float(value)
            except ValueError:
                continue
            family = _base(name, meta)
            per.setdefault(family, []).append(f"{name}{_with_label(labels, 'replica', replica)} {value}")
            key = (family, name, labels or "")
            total[key] = total.get(key, 0.0) + v
    out: list[str] = []
    for family in list(meta) + [f for f in per if f not in meta]:
        out += meta.get(family, [])
        out += [f"{name}{labels} {v:g}" for (fam, name, labels), v in total.items() if fam == family]
        out += per.get(family, [])
    text = "\n".join(out) + ("\n" if out else "")
    return text + extra
