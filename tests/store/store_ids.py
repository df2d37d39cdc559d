"""Constants and deterministic token ids shared by the cut-store tests (imported by name, not
through `conftest`, so these tests run in one pytest call with tests/server, which has its own)."""
from __future__ import annotations

from muser.testing import prompt_ids as ids  # noqa: F401 (the store tests import it from here)

WINDOW = 4          # the tiny models' sliding window (ring capacity 4)
BLOCK = 8           # the store's block size in these tests: 2 windows
