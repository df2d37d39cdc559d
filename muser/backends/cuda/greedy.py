"""Greedy steps on CUDA with the host hidden: step N+1 is launched before step N is read back.

Owns: `GreedySteps` -- launch a greedy step whose ids are host ints or the picks of the step
launched just before (still on the device), collect a step's picks, take a session's last step
back -- through the graph runner's captured steps, each batch size with a second graph
(`_Graphs`) that takes its ids from `res` and ends in the step's picks; and `pipelined`, a
`backends/greedy.py` run on it.  Does not own: the plane bookkeeping (the runner's `_advance`,
`Plane.advance`), the step's maths, what a run means (backends/greedy.py), the server's rounds
(server/decode_rounds.py, which drives the same three calls).

The timeline, one stream; the host's bookkeeping for a step runs while the one before computes:

    host:  advance(N+1) upload(N+1) replay(N+1) | wait(N) read picks(N) settle(N) | advance(N+2)
    GPU:   ....... step N ........|.......... step N+1 .........|......... step N+2 ......

A session that step N's pick ends (a stop id, a budget, a client gone) was already in step N+1,
which consumed that pick: `take_back` rewinds each plane to (len - 1, origins) -- metadata
only -- and drops the token from the lineage.  The rows kept are positions [origin, end - 1): a
ring (capacity = window) gives up nothing a later query reads (position end - 1 reads back to
end - window, the origin), a growing plane nothing at all.  The session then holds one old row
fewer than a step-by-step run leaves in a ring that wrapped: the same attention and the same
bits for every later token; a cut taken then has one row fewer.  Only a session's last step can
be taken back (a second would lose a row the next query reads).
"""
from __future__ import annotations

import torch

from ..greedy import Budget, FromLast, Greedy, Step, greedy_rows, run_steps, take_back


class _Graphs:
    """One batch size's pipelined pieces: the picks on the device (`res`: [2, B] token | ok),
    the graph of ids-from-res -> step -> picks, and two pinned buffers for each direction
    (ids, positions and plane metas up; picks down) with the events that free them."""

    def __init__(self, entry, device):
        B = entry.batch
        self.res = torch.zeros((2, B), dtype=torch.int64, device=device)
        cuda = torch.device(device).type == "cuda"
        pin = (lambda t: t.pin_memory()) if cuda else (lambda t: t)
        self.up = [pin(torch.zeros(entry.packed.shape, dtype=torch.int64)) for _ in range(2)]
        self.down = [pin(torch.zeros((2, B), dtype=torch.int64)) for _ in range(2)]
        # a step fed partly from the last step's picks: their rows there | their rows here
        self.sel = [pin(torch.zeros(2 * B, dtype=torch.int64)) for _ in range(2)]
        self.sel_dev = torch.zeros(2 * B, dtype=torch.int64, device=device)
        self.events = [torch.cuda.Event() if cuda else None for _ in range(2)]
        self.turn = 0
        self.graph = None
        self.pick_ws = None                    # triton_pick's workspace (on the GPU)


class GreedySteps:
    """launch / collect / take_back over a GraphRunner (module doc).  Inputs come checked."""

    def __init__(self, runner):
        self.runner = runner
        self.last: Step | None = None          # the step launched last: the only one a feed may name

    def launch(self, sessions, feeds) -> Step:
        """One greedy step: sessions[i] consumes feeds[i], an id or `FromLast(row)` -- that row's
        pick in the step launched last, on the device.  Refused or failed: every session is
        as it was."""
        r = self.runner
        views = [r._view(s) for s in sessions]
        saved = [v.state() for v in views]
        try:
            positions = [s.position for s in sessions]
            metas = [r._advance(v, p) for v, p in zip(views, positions)]
            g, k = self._replay(views, positions, metas, feeds)
        except BaseException:
            for v, st in zip(views, saved):
                v.restore(st)
            raise
        step = Step(list(sessions), (g, k, g.down[k], g.events[k]))
        for s, f in zip(sessions, feeds):
            if isinstance(f, FromLast):
                self.last.consumers[f.row] = s     # a device pick joins the lineage at collect
            else:
                s.tokens.append(int(f))
        self.last = step
        return step

    def collect(self, step: Step) -> tuple[list[int], list[bool]]:
        """The step's picks and whether each row had a finite logit (waits for the step); the
        sessions that consumed a pick in a later step take it into their lineage."""
        _, _, down, event = step.handle
        if event is not None:
            event.synchronize()
        best, ok = down.tolist()
        for j, s in step.consumers.items():
            s.tokens.append(best[j])
        return best, [bool(o) for o in ok]

    def take_back(self, session) -> None:
        take_back(session)

    def _replay(self, views, positions, metas, feeds):
        r = self.runner
        B = len(views)
        entry = r._entry(B)
        g = entry.greedy = getattr(entry, "greedy", None) or _Graphs(entry, r.engine.device)
        k = g.turn
        g.turn ^= 1
        if g.events[k] is not None:
            g.events[k].synchronize()              # the copies that last used up[k] / down[k] ran
        flat = [0 if isinstance(f, FromLast) else int(f) for f in feeds] + list(positions)
        for grp in range(len(r.group_kinds)):
            for m in metas:
                flat.extend(m[2 * grp: 2 * grp + 2])
        g.up[k].numpy()[:] = flat
        r._upload_tables(entry, views)
        self._ids(g, k, B, feeds)
        entry.packed[B:].copy_(g.up[k][B:], non_blocking=True)
        if not r.capture:
            _graph_body(r, entry, g)
        else:
            if g.graph is None:
                # capture's warm-up runs the step once (rows the replay rewrites identically)
                # and leaves its picks in res: this step's ids go back before the replay
                ids = g.res[0].clone()
                g.graph, _ = r.captured(lambda: _graph_body(r, entry, g))
                g.res[0].copy_(ids)
            g.graph.replay()
        r.stats["replays"] += 1
        g.down[k].copy_(g.res, non_blocking=True)
        if g.events[k] is not None:
            g.events[k].record()
        return g, k

    def _ids(self, g: _Graphs, k: int, B: int, feeds) -> None:
        """This step's ids into g.res[0], which the graph reads: host ints from up[k], device
        picks gathered from the last step's res (first, in case it is this very buffer).  Every
        copy comes from pinned memory, so none waits for the step in flight."""
        dev = [(i, f.row) for i, f in enumerate(feeds) if isinstance(f, FromLast)]
        if len(dev) == B and self.last.handle[0] is g and [f for _, f in dev] == list(range(B)):
            return                                 # the graph's own picks, in order: in place
        n = len(dev)
        picks = None
        if n:
            g.sel[k].numpy()[:2 * n] = [f for _, f in dev] + [i for i, _ in dev]
            g.sel_dev[:2 * n].copy_(g.sel[k][:2 * n], non_blocking=True)
            picks = self.last.handle[0].res[0].index_select(0, g.sel_dev[:n])
        g.res[0].copy_(g.up[k][:B], non_blocking=True)
        if n:
            g.res[0].index_copy_(0, g.sel_dev[n:2 * n], picks)


def _graph_body(runner, entry, g: _Graphs) -> torch.Tensor:
    """What the greedy graph holds: this step's ids from res, the step, its picks into res (on
    the GPU in one launch, triton_pick.py; elsewhere -- the host tests -- through torch).
    A step whose head can pick (DecodeStep.fused_pick) reads its ids in res and picks in the
    head: no id copy, no logits stored and read again."""
    B = entry.batch
    step = runner.step
    if step.fused_pick:
        return step.run(entry.packed, entry.tables, entry.ws, ids=g.res[0], pick=g.res)
    entry.packed[:B].copy_(g.res[0])
    logits = step.run(entry.packed, entry.tables, entry.ws)             # [B, vocab] float32
    if logits.is_cuda:
        from .triton_pick import PickWorkspace, pick_rows
        if g.pick_ws is None:
            g.pick_ws = PickWorkspace(B, logits.shape[1], logits.device)
        return pick_rows(logits, g.res, g.pick_ws, pdl=runner.step.pdl)
    best, ok = greedy_rows(logits)
    g.res.copy_(torch.stack([best, ok.long()]))
    return g.res


def pipelined(runner, sessions, run: Budget) -> Greedy:
    """`decode_loop`'s run with the host one step ahead (module doc)."""
    return run_steps(GreedySteps(runner), sessions, run)
