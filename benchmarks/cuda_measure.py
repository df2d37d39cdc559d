"""Measurements for benchmarks/cuda_bench.py (one GPU, same process): the copy bandwidth,
building random-weight models with transformers, muser decode / batched decode / prefill,
the transformers peer, the KV-bytes-vs-plan check and a logits cross-check."""
from __future__ import annotations

import os
import tempfile
import time

import torch


def sync():
    torch.cuda.synchronize()


def timed(fn, reps=20, warm=3):
    """ms per call of `fn` on the GPU (CUDA events around `reps` calls, after `warm` calls)."""
    for _ in range(warm):
        fn()
    sync()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    ev[0].record()
    for _ in range(reps):
        fn()
    ev[1].record()
    sync()
    return ev[0].elapsed_time(ev[1]) / reps


def copy_bandwidth() -> float:
    """Bytes read + written per second by a large device-to-device copy."""
    n = 2 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    sync()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    times = []
    for _ in range(10):
        ev[0].record()
        dst.copy_(src)
        ev[1].record()
        sync()
        times.append(ev[0].elapsed_time(ev[1]) / 1e3)
    del src, dst
    return 2 * n / sorted(times)[len(times) // 2]


def build(shape: dict, max_context: int):
    import transformers as tr
    types = ["full_attention" if (i + 1) % shape["pattern"] == 0 else "sliding_attention"
             for i in range(shape["layers"])]
    common = dict(vocab_size=shape["vocab"], hidden_size=shape["hidden"],
                  intermediate_size=shape["ffn"], num_hidden_layers=shape["layers"],
                  num_attention_heads=shape["heads"], num_key_value_heads=shape["kv"],
                  max_position_embeddings=max_context, sliding_window=shape["window"],
                  layer_types=types, pad_token_id=0, eos_token_id=1, bos_token_id=2,
                  tie_word_embeddings=True)
    if shape["arch"] == "gemma3":
        cfg = tr.Gemma3TextConfig(head_dim=shape["head_dim"], query_pre_attn_scalar=shape["head_dim"],
                                  **common)
        cls = tr.Gemma3ForCausalLM
    else:
        cfg = tr.Cohere2Config(logit_scale=0.25, **common)
        cls = tr.Cohere2ForCausalLM
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = cls(cfg).to(torch.bfloat16)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    model.eval()
    root = "/dev/shm" if os.path.isdir("/dev/shm") else None
    path = tempfile.mkdtemp(prefix="muser-bench-", dir=root)
    model.save_pretrained(path, safe_serialization=True)
    return model, path


def rand_ids(n, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n,), generator=g).tolist()


def reserve(session, rows):
    for p in session.planes:
        if p.kind == "growing":
            p.reserve(rows)


def profile_step(engine, batch, reps=5):
    """Kernel time of one decode step run eagerly (same launches as the graph): total us per step
    and the top kernels [(name, launches per step, us per step)]."""
    from torch.profiler import ProfilerActivity, profile
    runner = engine.decode_runner()
    entry = runner.entries[batch]
    runner._step(entry)
    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            runner._step(entry)
        sync()
    total, rows = top_kernels(prof, reps, 1.0, 70)
    return round(total, 1), [(n, c, round(t, 1)) for n, c, t in rows[:14]]


def top_kernels(prof, reps, unit, width):
    """A profile's kernels, busiest first: total and [(name, launches, time)], per rep, in
    microseconds / `unit`."""
    rows = []
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        if t > 0 and ev.count:
            rows.append((ev.key[:width], ev.count / reps, t / reps / unit))
    rows.sort(key=lambda r: -r[2])
    return sum(r[2] for r in rows), rows


def muser_decode(engine, context, steps, vocab, seed=1, prof=False):
    s = engine.new_session()
    reserve(s, context + steps + 16)
    s.prefill(rand_ids(context, vocab, seed), chunk_size=4096)
    tok = 5
    for _ in range(8):                                   # capture + warm
        tok = int(s.decode(tok).argmax())
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        tok = int(s.decode(tok).argmax())
    api = (time.perf_counter() - t0) / steps
    entry = engine.decode_runner().entries[1]
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    ev[0].record()
    for _ in range(steps):
        entry.graph.replay()                             # same step again: the GPU work alone
    ev[1].record()
    sync()
    return api, ev[0].elapsed_time(ev[1]) / 1e3 / steps, profile_step(engine, 1) if prof else None


def prefilled(engine, batch, context, room, vocab):
    """`batch` sessions, each prefilled with `context` random ids and room for `room` more."""
    sessions = []
    for i in range(batch):
        s = engine.new_session()
        reserve(s, context + room)
        s.prefill(rand_ids(context, vocab, 100 + i), chunk_size=4096)
        sessions.append(s)
    return sessions


def muser_batch(engine, batch, context, steps, vocab, prof=False):
    sessions = prefilled(engine, batch, context, steps + 16, vocab)
    toks = [5] * batch
    for _ in range(3):
        toks = engine.decode_batch(sessions, toks).argmax(-1).tolist()
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        toks = engine.decode_batch(sessions, toks).argmax(-1).tolist()
    dt = time.perf_counter() - t0
    entry = engine.decode_runner().entries[batch]
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    ev[0].record()
    for _ in range(steps):
        entry.graph.replay()
    ev[1].record()
    sync()
    bare = ev[0].elapsed_time(ev[1]) / 1e3 / steps
    return batch * steps / dt, dt / steps, bare, profile_step(engine, batch) if prof else None


def muser_greedy(engine, batch, context, steps, vocab, prof=False):
    """`engine.decode_greedy` (pipelined with MUSER_PIPELINE=on): `batch` sessions
    at `context`, `steps` greedy tokens each with no stop id -> (tokens/s, ms a step[, profile]).
    The same steps as `muser_batch`'s loop, with the host's share hidden behind the GPU.
    `prof`: 16 more steps under the profiler -- every kernel and copy a step (replayed graphs
    included), us -- to find what a greedy step adds to the bare replay."""
    sessions = prefilled(engine, batch, context, steps + 32 + 16 * prof, vocab)
    out = engine.decode_greedy(sessions, [5] * batch, 8, stop_ids=())       # capture + warm
    toks = [t[-1] for t in out.tokens]
    sync()
    t0 = time.perf_counter()
    out = engine.decode_greedy(sessions, toks, steps, stop_ids=())
    dt = time.perf_counter() - t0
    if any(len(t) != steps for t in out.tokens):          # a run cut short would read as fast
        raise RuntimeError(f"greedy run cut short: finishes {out.finish}")
    if not prof:
        return batch * steps / dt, dt / steps * 1e3
    from torch.profiler import ProfilerActivity, profile
    toks = [t[-1] for t in out.tokens]
    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        engine.decode_greedy(sessions, toks, 16, stop_ids=())
        sync()
    total, rows = top_kernels(p, 16, 1.0, 70)
    return batch * steps / dt, dt / steps * 1e3, (round(total, 1),
                                                  [(n, c, round(t, 1)) for n, c, t in rows[:14]])


def prefill_profile(engine, n, vocab, chunk=None):
    """Kernel time of one n-token prefill in chunks of `chunk` rows (None: the engine's
    default): total ms, wall ms, top kernels [(name, launches, ms)]."""
    from torch.profiler import ProfilerActivity, profile
    s = engine.new_session()
    reserve(s, n)
    ids = rand_ids(n, vocab, 11)
    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        s.prefill(ids, chunk_size=chunk)
        sync()
        wall = time.perf_counter() - t0
    total, rows = top_kernels(prof, 1, 1e3, 60)
    return round(total, 1), round(wall * 1e3, 1), [(n, int(c), round(t, 2)) for n, c, t in rows[:16]]


def prefill_sequence(engine, n, vocab, name, chunk=None):
    """Milliseconds of each launch of kernel `name` in one n-token prefill (chunks of `chunk`
    rows), in launch order (the chunk attention: one a layer, so its layers' costs side by
    side)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    s = engine.new_session()
    reserve(s, n)
    ids = rand_ids(n, vocab, 12)
    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        s.prefill(ids, chunk_size=chunk)
        sync()
    evs = [e for e in prof.events() if e.name.startswith(name) and e.device_type == DeviceType.CUDA]
    evs.sort(key=lambda e: e.time_range.start)
    return [round(e.time_range.elapsed_us() / 1e3, 2) for e in evs]


def _best_prompt(engine, n, vocab, reps, seed, run):
    """Best seconds of `run(session, ids)` over reps fresh n-token prompts, after one that warms
    (kernels, tables, graphs); `run` returns once what it times is done."""
    best = None
    for r in range(reps + 1):
        s = engine.new_session()
        reserve(s, n)
        ids = rand_ids(n, vocab, seed + r)
        sync()
        t0 = time.perf_counter()
        run(s, ids)
        dt = time.perf_counter() - t0
        if r:
            best = dt if best is None else min(best, dt)
        del s
    return best


def muser_prefill(engine, n, vocab, chunk, reps=2):
    """Prefill tok/s of an n-token prompt (default chunking: `chunk` None)."""
    def run(s, ids):
        s.prefill(ids, chunk_size=chunk)
        sync()
    return n / _best_prompt(engine, n, vocab, reps, 7, run)


def muser_ttft(engine, n, vocab, reps=3):
    """Time to first token of an n-token prompt, seconds: the prefill, then the greedy token
    read back to the host -- what a client waits for."""
    return _best_prompt(engine, n, vocab, reps, 17, lambda s, ids: int(s.prefill(ids).argmax()))


@torch.no_grad()
def hf_prefill(model, n, vocab, reps=2):
    best = None
    for r in range(reps + 1):
        ids = torch.tensor([rand_ids(n, vocab, 7 + r)], device="cuda")
        sync()
        t0 = time.perf_counter()
        model(ids, use_cache=True, logits_to_keep=1)
        sync()
        dt = time.perf_counter() - t0
        if r:
            best = dt if best is None else min(best, dt)
    return n / best


@torch.no_grad()
def hf_decode(model, batch, context, steps, vocab):
    ids = torch.tensor([rand_ids(context, vocab, 200 + b) for b in range(batch)], device="cuda")
    out = model(ids, use_cache=True, logits_to_keep=1)
    pkv, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
    for _ in range(3):
        out = model(nxt, past_key_values=pkv, use_cache=True)
        pkv, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        out = model(nxt, past_key_values=pkv, use_cache=True)
        pkv = out.past_key_values
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        nxt.tolist()                                     # read back, as a server would
    return (time.perf_counter() - t0) / steps


@torch.no_grad()
def cross_check(engine, model, vocab, n=96, steps=6):
    """Relative error of muser's logits against transformers' (same weights), prefill + decode."""
    ids = rand_ids(n, vocab, 3)
    s = engine.new_session()
    mine = [s.prefill(ids, chunk_size=32)]
    out = model(torch.tensor([ids], device="cuda"), use_cache=True)
    theirs, pkv = [out.logits[0, -1].float()], out.past_key_values
    for _ in range(steps):
        tok = int(theirs[-1].argmax())
        mine.append(s.decode(tok))
        out = model(torch.tensor([[tok]], device="cuda"), past_key_values=pkv, use_cache=True)
        theirs.append(out.logits[0, -1].float())
        pkv = out.past_key_values
    errs = [float((a - b).norm() / b.norm()) for a, b in zip(mine, theirs)]
    agree = sum(int(a.argmax() == b.argmax()) for a, b in zip(mine, theirs))
    return max(errs), agree, len(mine)


def kv_check(engine, context):
    from muser.cache import CacheGeometry, plan
    spec = engine.spec
    s = engine.new_session()
    reserve(s, context)
    geo = CacheGeometry(tuple(l.window for l in spec.layers), spec.num_kv_heads, spec.head_dim,
                        engine.cache_dtype.itemsize, engine.max_context)
    got = sum(p.allocated_bytes() for p in s.planes)
    return got, plan(geo, context).total_bytes


def round_session(shape: dict, context: int):
    """An engine on `shape`'s random weights with one session at `context` positions, and a
    speculative round's two shapes on it, each leaving the session where it was: `block(rows)`
    (checkpoint, extend `rows` tokens, roll all back -- a verification block) and `decode()`
    (one graph-replayed step, rolled back).  Returns (engine, session, block, decode)."""
    import muser
    _, path = build(shape, context + 1024)
    eng = muser.load(path, device="cuda", dtype="bfloat16", progress=False)
    s = eng.new_session()
    reserve(s, context + 64)
    s.prefill(rand_ids(context, shape["vocab"], 5))
    tok = rand_ids(64, shape["vocab"], 6)

    def block(rows):
        cp = s.checkpoint(rows)
        s.extend(tok[:rows])
        s.rollback(cp, keep=0)

    def decode():
        cp = s.checkpoint(1)
        s.decode(tok[0])
        s.rollback(cp, keep=0)

    return eng, s, block, decode
