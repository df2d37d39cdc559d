"""Greedy runs on CUDA with the host hidden: step N+1 is launched before step N is read back.

Owns: `pipelined(runner, sessions, run)` -- a `backends/greedy.py` run through the graph
runner's captured steps, each batch size with a second graph (`_Greedy`) that takes its ids
from the step before it on the device and ends in that step's greedy picks.  Does not own: the
plane bookkeeping (the runner's `_advance`, `Plane.advance`), the step's maths, what a run
means (backends/greedy.py: the same tokens, finishes and session lineages as `decode_loop`).

The timeline, one stream; the host's bookkeeping for a step runs while the one before computes:

    host:  advance(N+1) upload(N+1) replay(N+1) | wait(N) read picks(N) settle(N) | advance(N+2)
    GPU:   ....... step N ........|.......... step N+1 .........|......... step N+2 ......

A session whose step-N pick ends it (a stop id, a row with no finite logit) was already in step
N+1, which consumed that pick: it is taken back with `Plane.rewind` to (len - 1, origins) --
metadata only.  The rows it keeps are the positions [origin, end - 1); a ring gives up nothing a
later query reads (position end - 1 reads back to end - window, at or after the origin whenever
the ring holds a window), and a growing plane loses nothing.  The session then holds one old row
fewer than `decode_loop` leaves in a ring that wrapped: the same attention, the same bits for
every later token; a cut taken then has one row fewer.
"""
from __future__ import annotations

import torch

from ..greedy import Budget, Greedy, greedy_rows, settle


class _Greedy:
    """One batch size's pipelined pieces: the picks on the device (`res`: [2, B] token | ok),
    the graph of ids-from-res -> step -> picks, and two pinned buffers for each direction
    (positions and plane metas up, picks down) with the events that free them."""

    def __init__(self, entry, device):
        B = entry.batch
        self.res = torch.zeros((2, B), dtype=torch.int64, device=device)
        cuda = torch.device(device).type == "cuda"
        pin = (lambda t: t.pin_memory()) if cuda else (lambda t: t)
        self.up = [pin(torch.zeros(entry.packed.shape, dtype=torch.int64)) for _ in range(2)]
        self.down = [pin(torch.zeros((2, B), dtype=torch.int64)) for _ in range(2)]
        self.events = [torch.cuda.Event() if cuda else None for _ in range(2)]
        self.turn = 0
        self.graph = None


def _step(runner, entry, g: _Greedy) -> torch.Tensor:
    """What the greedy graph holds: this step's ids from the last picks, the step, its picks."""
    B = entry.batch
    entry.packed[:B].copy_(g.res[0])
    logits = runner.step.run(entry.packed, entry.tables, entry.ws)      # [B, vocab] float32
    best, ok = greedy_rows(logits)
    g.res.copy_(torch.stack([best, ok.long()]))
    return g.res


def _launch(runner, views, positions, metas, ids_from) -> tuple:
    """Upload step inputs and replay the batch size's greedy graph; returns (g, down, event).
    `ids_from`: (tensor [B'] on the device, index list) -- this step's ids are
    tensor[index] (the last step's picks of the sessions that go on) -- or a list of ints."""
    B = len(views)
    entry = runner._entry(B)
    g = entry.greedy = getattr(entry, "greedy", None) or _Greedy(entry, runner.engine.device)
    if isinstance(ids_from, list):
        g.res[0].copy_(torch.tensor(ids_from, dtype=torch.int64))
    else:
        src, index = ids_from
        if src is not g.res[0] or index != list(range(B)):
            g.res[0].copy_(src[torch.tensor(index, device=src.device)])
    k = g.turn
    g.turn ^= 1
    if g.events[k] is not None:
        g.events[k].synchronize()                # the upload that last read up[k] has run
    flat = [0] * B + list(positions)
    for grp in range(len(runner.group_kinds)):
        for m in metas:
            flat.extend(m[2 * grp: 2 * grp + 2])
    g.up[k].numpy()[:] = flat
    runner._upload_tables(entry, views)
    entry.packed[B:].copy_(g.up[k][B:], non_blocking=True)
    if not runner.capture:
        _step(runner, entry, g)
    else:
        if g.graph is None:
            # capture's warm-up runs the step once (rows the replay rewrites identically) and
            # leaves its picks in res: this step's ids go back before the replay reads them
            from .capture import capture
            ids = g.res[0].clone()
            g.graph, _ = capture(lambda: _step(runner, entry, g), runner._pool())
            g.res[0].copy_(ids)
            runner.stats["captures"] += 1
        g.graph.replay()
    runner.stats["replays"] += 1
    g.down[k].copy_(g.res, non_blocking=True)
    if g.events[k] is not None:
        g.events[k].record()
    return g, g.down[k], g.events[k]


def pipelined(runner, sessions, run: Budget) -> Greedy:
    """`decode_loop`'s run with the host one step ahead (module doc)."""
    out = Greedy([[] for _ in sessions], ["length"] * len(sessions))
    views = {b: runner._view(s) for b, s in enumerate(sessions)}
    live = [b for b, m in enumerate(run.budgets) if m > 0]
    # steps[b]: steps launched for b; a session is in the next launch while its budget allows
    steps = dict.fromkeys(live, 0)
    pending = None                    # (sessions of the step in flight, g, down, event)
    done: set = set()                 # sessions whose run has ended (a step in flight may hold one)
    ids_from = [run.tokens[b] for b in live]
    while live or pending:
        launched = None
        if live:
            vs = [views[b] for b in live]
            saved = [v.state() for v in vs]
            try:
                positions = [sessions[b].position for b in live]
                metas = [runner._advance(v, p) for v, p in zip(vs, positions)]
                launched = (list(live), *_launch(runner, vs, positions, metas, ids_from))
            except BaseException:
                for v, st in zip(vs, saved):
                    v.restore(st)
                _drain(pending, sessions, run, out, set(), done)
                raise
            for b in live:
                steps[b] += 1
        # read back the step before (the GPU is busy with the one just launched)
        feeding = set(launched[0]) if launched else set()
        goes_on = _drain(pending, sessions, run, out, feeding, done)
        if pending is None:                           # the first step: its feed is the prompt's
            for b in launched[0]:
                sessions[b].tokens.append(run.tokens[b])
        pending = launched
        if launched is None:
            break
        # the next launch: sessions of the step just launched whose budget has room and that
        # the step before did not end (its picks feed them); their ids are that step's picks
        ended = {b for b in launched[0] if goes_on is not None and b not in goes_on}
        live = [b for b in launched[0] if b not in ended and steps[b] < run.budgets[b]]
        index = [launched[0].index(b) for b in live]
        ids_from = (launched[1].res[0], index)
        for b in ended:                                # in the step in flight: taken back
            _take_back(views[b], sessions[b])
    return out


def _drain(pending, sessions, run: Budget, out: Greedy, feeding: set, done: set):
    """Read a step's picks and settle them; the sessions in `feeding` consumed them in the step
    launched since (their lineage grows by the pick).  A session in `done` (its run ended at the
    step before: this step was its extra one, taken back) is skipped; one that ends here joins
    it.  Returns the sessions that go on, or None when nothing was pending."""
    if pending is None:
        return None
    members, g, down, event = pending
    if event is not None:
        event.synchronize()
    best, ok = down.tolist()
    goes = set()
    for j, b in enumerate(members):
        if b in done:
            continue
        if settle(b, best[j], bool(ok[j]), run, out):
            goes.add(b)
            if b in feeding:
                sessions[b].tokens.append(best[j])
        else:
            done.add(b)
    return goes


def _take_back(view, session) -> None:
    """Undo the last step of a session that should not have taken it: every plane rewinds one
    row (metadata; module doc), the lineage is already without it."""
    for group in view.groups:
        for p in group:
            p.rewind((p.len - 1, p.origin_logical, p.origin_physical))
