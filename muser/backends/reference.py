"""The reference backend: the eager maths and the reference attention -- the oracle.

Owns: `ReferenceBackend` -- the plain-torch ops table (`model.ops.EAGER`)
and `attention.reference.attention` for every call, no kernel of any device.
It runs the float32 full-history oracle (`backend="oracle"`: every plane grows,
a sliding layer's window is only a mask) and any device without a backend of
its own.  Slow by design; the specification the other backends are tested
against.  Does not own: the planes (muser.cache.PLANES picks them by family).
"""
from __future__ import annotations

import torch

from ..attention.reference import attention as reference_attention
from ..model.ops import EAGER
from .base import Backend


def attend(q, k, v, mask, scale, softcap=None, sinks=None):
    """The reference attention; `mask` None means every key is visible; sinks: gpt-oss's."""
    if mask is None:
        mask = torch.ones(q.shape[0], k.shape[0], dtype=torch.bool, device=q.device)
    return reference_attention(q, k, v, mask, scale, softcap, sinks)


class ReferenceBackend(Backend):
    name = "reference"
    ops = EAGER

    def __init__(self, config, env):
        super().__init__(config, env)
        self.attention = attend
