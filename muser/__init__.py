"""muser: an inference engine and OpenAI-compatible server for hybrid-attention models.

    import muser
    engine = muser.load("gemma3-270m")
    print(engine.generate("The capital of France is", max_tokens=16))
"""
from .cache import Encoding, SessionSnapshot
from .config import EngineConfig, LayerSpec, ModelSpec
from .errors import *  # noqa: F401,F403  (every typed error is importable from muser)
from .errors import __doc__ as _errors_doc  # noqa: F401
from .engine import DEFAULT_MODEL, Engine, SamplingParams, Session, load, make_drafter
from .store import CutStore

__version__ = "0.1.0"


def serve_app(*args, **kwargs):
    """The OpenAI server as a Ray Serve application: engine replicas behind one endpoint.

    `serve.run(muser.serve_app("gemma3-270m", num_replicas=2))` -- arguments in
    muser.server.replicas.deployments.serve_app; docs/scale-out.md.  Needs `muser[ray]`."""
    from .server.replicas import serve_app as build
    return build(*args, **kwargs)
