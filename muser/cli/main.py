"""The `muser` command line: the top-level parser, generate and chat.

Owns: the parser (`build_parser`: generate, chat here; cache-plan, pack and serve registered
from cli/plan.py, cli/pack.py, cli/serve.py), `main`, which turns typed errors into one clear
line (exit 2), and the generate and chat commands.  Does not own: any engine, pack or server
logic (each command calls into its package; no package imports the CLI).
"""
from __future__ import annotations

import argparse
import sys

from .args import load_engine, model_args, read_key, sampling_args
from .pack import add_pack_commands
from .plan import add_plan_command
from .serve import add_serve_command


def cmd_generate(args) -> int:
    from ..pack import load_pack, save_pack
    engine = load_engine(args)
    session = engine.new_session()
    key = read_key(args.key_file)
    if args.resume:
        engine.restore(load_pack(args.resume, key=key), into=session)
    base = session.position
    stats: dict = {}
    from ..engine.generate import stream_text
    stop_ids = _chat_guard(engine) if args.chat else set()
    prompt_ids = engine.encode_prompt(args.prompt, chat=args.chat)
    if args.resume and prompt_ids and engine.spec.bos_token_id is not None and prompt_ids[0] == engine.spec.bos_token_id:
        prompt_ids = prompt_ids[1:]          # a continuation carries no second BOS
    produced: list[int] = []

    drafter = None
    if args.speculative:
        from ..engine.speculative import make_drafter
        drafter = make_drafter(args.speculative, engine)       # a draft model is loaded once

    def ids():
        for t in engine.stream(prompt_ids, args.max_tokens, args.temperature, args.top_p, args.top_k,
                               args.seed, session=session, speculative=drafter,
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
        save_pack(session.snapshot(), args.save, key=key)
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
    from ..engine.generate import stream_text
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
        pieces = (_channels(engine, tokens, args.stop) if getattr(engine.tokenizer, "harmony", False)
                  else stream_text(engine, tokens, args.stop))
        for piece in pieces:
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
    from ..server.text import base_model_note, turn_marker_ids
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


def _channels(engine, tokens, stop):
    """A harmony reply (gpt-oss): the answer's text deltas; the reasoning goes to stderr, dimmed,
    and stays out of the conversation (as harmony drops earlier analysis)."""
    from ..server.channels import ChannelText
    stops = [stop] if isinstance(stop, str) else [s for s in (stop or []) if s]
    ct, thinking = ChannelText(engine.tokenizer, stops), False
    for t in tokens:
        out, stopped = ct.push(t)
        thought = ct.take_reasoning()
        if thought:
            sys.stderr.write(("" if thinking else "\x1b[2m[thinking] ") + thought)
            thinking = True
        if out:
            if thinking:
                sys.stderr.write("\x1b[0m\n")
                thinking = False
            yield out
        if stopped:
            return
    tail, thought = ct.flush(), ct.take_reasoning()
    if thought or thinking:
        sys.stderr.write(thought + "\x1b[0m\n")
    if tail:
        yield tail


def _counting(ids, seen: list):
    """Pass token ids through, recording them in `seen`."""
    for i in ids:
        seen.append(i)
        yield i


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="muser", description="Hybrid-attention inference engine and server.")
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="stream a continuation of PROMPT to stdout")
    g.add_argument("prompt")
    model_args(g)
    sampling_args(g)
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    g.add_argument("--speculative", default=None, help="prompt-lookup | draft:MODEL")
    g.add_argument("--block", type=int, default=None, help="speculative block size (max 16)")
    g.add_argument("--resume", default=None, help="continue from a session pack")
    g.add_argument("--save", default=None, help="save the session pack after generating")
    g.add_argument("--key-file", default=None, help="HMAC key for packs (or MUSER_PACK_KEY)")
    g.set_defaults(func=cmd_generate)

    c = sub.add_parser("chat", help="interactive chat with streaming output")
    model_args(c)
    sampling_args(c)
    c.add_argument("--system", default=None)
    c.add_argument("--stats", action="store_true", help="after each reply, print prompt reuse and speed to stderr")
    c.set_defaults(func=cmd_chat)

    add_plan_command(sub)
    add_pack_commands(sub)
    add_serve_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from ..errors import MuserError
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

