"""The `muser` command line: generate | chat | cache-plan | pack | serve.

Owns: argument parsing and turning typed errors into one clear line (exit 2).
Does not own: any engine, pack or server logic (each subcommand calls into its
package; `pack` and `serve` register themselves from muser.pack.cli and
muser.server.cli).
"""
from __future__ import annotations

import argparse
import sys

from .engine.loader import DEFAULT_MODEL


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"embedded name, .gguf file or HF dir (default {DEFAULT_MODEL})")
    p.add_argument("--device", default="cpu", help="cpu | cuda (default cpu)")
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: fastest accurate for the device)")
    p.add_argument("--backend", default="ring", choices=["ring", "oracle"])
    p.add_argument("--quant", default=None, help="CPU weight path: none | int8 (default: fastest accurate)")
    p.add_argument("--max-context", type=int, default=None)
    p.add_argument("--chunk-size", type=int, default=None,
                   help="prefill chunk in tokens (default: 512 on CPU, 8k-16k on CUDA by GPU memory); "
                        "a server with many users may want smaller chunks, so decode steps are not held up")


def _sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")


def load_engine(args):
    from .engine.loader import load
    return load(args.model, device=args.device, dtype=args.dtype, backend=args.backend,
                max_context=args.max_context, quant=args.quant, chunk_size=args.chunk_size)


def read_key(key_file: str | None) -> bytes | None:
    """The pack key, read exactly as `muser pack verify` reads it (--key-file, else MUSER_PACK_KEY)."""
    from .pack.manifest import load_key
    return load_key(key_file)


def cmd_generate(args) -> int:
    from .cache import SessionSnapshot
    engine = load_engine(args)
    session = engine.new_session()
    key = read_key(args.key_file)
    if args.resume:
        engine.restore(SessionSnapshot.load(args.resume, key=key), into=session)
    base = session.position
    stats: dict = {}
    from .engine.generate import stream_text
    stop_ids = _chat_guard(engine) if args.chat else set()
    prompt_ids = engine.encode_prompt(args.prompt, chat=args.chat)
    if args.resume and prompt_ids and engine.spec.bos_token_id is not None and prompt_ids[0] == engine.spec.bos_token_id:
        prompt_ids = prompt_ids[1:]          # a continuation carries no second BOS
    produced: list[int] = []

    def ids():
        for t in engine.stream(prompt_ids, args.max_tokens, args.temperature, args.top_p, args.top_k,
                               args.seed, session=session, speculative=args.speculative,
                               block=args.block, stats=stats):
            if t in stop_ids:
                return
            produced.append(t)
            yield t
    for piece in stream_text(engine, ids(), args.stop):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    if args.speculative and stats:
        print(f"[speculative] acceptance {stats.get('acceptance', 0):.2%}, "
              f"{stats.get('tokens_per_forward', 0):.2f} tokens per target forward", file=sys.stderr)
    if args.save:
        if produced and session.position == base + len(prompt_ids) + len(produced) - 1:
            session.prefill([produced[-1]])    # the last sampled token was never consumed
        session.snapshot().save(args.save, key=key)
        print(f"[saved] {args.save} at position {session.position}", file=sys.stderr)
    return 0


def cmd_chat(args) -> int:
    """Multi-turn chat that keeps its cache between turns.

    Each turn re-renders the conversation with the chat template.  If that
    extends what the session holds (the reply re-tokenizes as sampled), only
    the new suffix is prefilled; otherwise the session goes back to `mark`, a
    snapshot taken just before the last reply, so at least the earlier
    conversation is never prefilled twice.
    """
    import time
    from .engine.generate import stream_text
    engine = load_engine(args)
    stop_ids = _chat_guard(engine)
    session = engine.new_session()
    mark = None
    messages = [{"role": "system", "content": args.system}] if args.system else []
    while True:
        try:
            line = input("you> ")
        except EOFError:
            print()
            return 0
        if line.strip() in ("/exit", "/quit"):
            return 0
        messages.append({"role": "user", "content": line})
        ids = engine.tokenizer.apply_chat_template(messages)
        held = session.tokens
        if not (held and len(held) < len(ids) and ids[:len(held)] == held):
            if mark is not None and ids[:mark.position] == list(mark.tokens):
                session.install(mark)
            else:
                session.reset()
        reused = len(session.tokens)
        new = ids[reused:]
        t0 = time.perf_counter()
        if len(new) > 1:
            session.prefill(new[:-1])
        mark = session.snapshot()
        sys.stdout.write("model> ")
        reply, reply_ids = [], []
        tokens = _counting(_until(engine.stream(new[-1:], args.max_tokens, args.temperature, args.top_p,
                                                args.top_k, args.seed, session=session), stop_ids), reply_ids)
        for piece in stream_text(engine, tokens, args.stop):
            reply.append(piece)
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        if args.stats:
            print(f"[prompt {len(ids)} tokens, {reused} reused from the cache; {len(reply_ids)} generated "
                  f"in {time.perf_counter() - t0:.2f} s]", file=sys.stderr)
        messages.append({"role": "assistant", "content": "".join(reply)})


def _chat_guard(engine) -> set[int]:
    """Chat on this model: warn once if it looks like a base model; the turn-marker stop ids."""
    from .server.text import base_model_note, turn_marker_ids
    note = base_model_note(engine)
    if note:
        print(f"muser: warning: {note}", file=sys.stderr)
    return set(turn_marker_ids(engine.tokenizer))


def _until(ids, stop_ids: set):
    """Pass token ids through until one of `stop_ids` (not passed on)."""
    for i in ids:
        if i in stop_ids:
            return
        yield i


def _counting(ids, seen: list):
    """Pass token ids through, recording them in `seen`."""
    for i in ids:
        seen.append(i)
        yield i


def cmd_cache_plan(args) -> int:
    from .engine.plan_cli import run_cache_plan
    return run_cache_plan(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="muser", description="Hybrid-attention inference engine and server.")
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="stream a continuation of PROMPT to stdout")
    g.add_argument("prompt")
    _model_args(g)
    _sampling_args(g)
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    g.add_argument("--speculative", default=None, help="prompt-lookup | draft:MODEL")
    g.add_argument("--block", type=int, default=None, help="speculative block size (max 16)")
    g.add_argument("--resume", default=None, help="continue from a session pack")
    g.add_argument("--save", default=None, help="save the session pack after generating")
    g.add_argument("--key-file", default=None, help="HMAC key for packs (or MUSER_PACK_KEY)")
    g.set_defaults(func=cmd_generate)

    c = sub.add_parser("chat", help="interactive chat with streaming output")
    _model_args(c)
    _sampling_args(c)
    c.add_argument("--system", default=None)
    c.add_argument("--stats", action="store_true", help="after each reply, print prompt reuse and speed to stderr")
    c.set_defaults(func=cmd_chat)

    p = sub.add_parser("cache-plan", help="bytes of the sliding and full planes at N tokens (config only)")
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL)
    p.add_argument("--context", type=int, required=True)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--max-context", type=int, default=None)
    p.add_argument("--plot", default=None, help="draw both cost curves to this PNG")
    p.set_defaults(func=cmd_cache_plan)

    try:
        from .pack.cli import add_pack_commands
        add_pack_commands(sub)
    except ImportError:
        pass
    try:
        from .server.cli import add_serve_command
        add_serve_command(sub)
    except ImportError:
        pass
    return parser


def main(argv: list[str] | None = None) -> int:
    from .errors import MuserError
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except MuserError as e:
        print(f"muser: error: {e}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as e:
        print(f"muser: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
