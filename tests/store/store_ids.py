"""Constants and deterministic token ids shared by the cut-store tests (imported by name, not
through `conftest`, so these tests run in one pytest call with tests/server, which has its own)."""
from __future__ import annotations

import torch

WINDOW = 4          # the tiny models' sliding window (ring capacity 4)
BLOCK = 8           # the store's block size in these tests: 2 windows


def ids(n: int, seed: int = 0, vocab: int = 384) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n,), generator=g).tolist()
