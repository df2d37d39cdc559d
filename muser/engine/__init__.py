"""muser.engine: sessions, generation and speculation over muser.cache and muser.model.

Owns: `Engine`, `Session`, `load`, sampling, the generation loop, speculative
decoding.  Does not own: HTTP (muser.server) or storage layouts (muser.cache).
"""
from .engine import Engine
from .loader import DEFAULT_MODEL, load
from .sampling import SamplingParams, sample
from .session import Session
from .speculative import make_drafter

__all__ = ["Engine", "Session", "load", "DEFAULT_MODEL", "SamplingParams", "sample", "make_drafter"]
