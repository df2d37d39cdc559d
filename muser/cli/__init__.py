"""muser.cli: the `muser` command.  No package imports the CLI.

    args.py    flags several commands share (model, sampling), load_engine, read_key
    main.py    the top-level parser, error policy (exit 2), generate, chat
    plan.py    cache-plan: cost curves from a model's header
    pack.py    pack inspect | verify | save
    serve.py   serve: flags -> ServerConfig -> engine -> uvicorn
"""
from .args import load_engine, read_key
from .main import build_parser, main

__all__ = ["main", "build_parser", "load_engine", "read_key"]
