"""muser: an inference engine and OpenAI-compatible server for hybrid-attention models.

    import muser
    engine = muser.load("gemma3-270m")
    print(engine.generate("The capital of France is", max_tokens=16))
"""
from importlib import import_module

from .errors import *  # noqa: F401,F403  (every typed error is importable from muser)
from .errors import __doc__ as _errors_doc  # noqa: F401

__version__ = "0.1.0"

# The rest is imported on first use (PEP 562): `import muser.server.front` -- the HTTP front
# process of `muser serve --front-process` -- must not pay for torch, which these bring.
_LAZY = {"Encoding": ".cache", "SessionSnapshot": ".cache", "EngineConfig": ".config",
         "LayerSpec": ".config", "ModelSpec": ".config", "DEFAULT_MODEL": ".engine",
         "Engine": ".engine", "SamplingParams": ".engine", "Session": ".engine",
         "load": ".engine", "make_drafter": ".engine", "CutStore": ".store"}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'muser' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


def serve_app(*args, **kwargs):
    """The OpenAI server as a Ray Serve application: engine replicas behind one endpoint.

    `serve.run(muser.serve_app("gemma3-270m", num_replicas=2))` -- arguments in
    muser.server.replicas.deployments.serve_app; docs/scale-out.md.  Needs `muser[ray]`."""
    from .server.replicas import serve_app as build
    return build(*args, **kwargs)
