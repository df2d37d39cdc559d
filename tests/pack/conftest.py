"""Fixtures for the session-pack tests: a synthetic snapshot and the tiny-engine factory.

Owns: `snap` and `tiny_engine` (skips when the engine cannot build a tiny model).
Does not own the builders (packutil.py) or any assertion.
"""
from __future__ import annotations

import pytest

from packutil import synthetic_snapshot


@pytest.fixture
def snap():
    return synthetic_snapshot()[0]


@pytest.fixture(scope="session")
def tiny_engine():
    """tiny_engine(**kw) -> Engine; cached per argument set; skips if the engine is unavailable."""
    try:
        from muser.testing import tiny_model
    except ImportError as e:          # pragma: no cover - before the engine lands
        pytest.skip(f"engine unavailable: {e}")
    cache = {}

    def get(**kw):
        key = tuple(sorted(kw.items()))
        if key not in cache:
            cache[key] = tiny_model(**kw)
        return cache[key]
    return get
