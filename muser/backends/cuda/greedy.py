"""Greedy steps on CUDA with the host hidden: step N+1 is launched before step N is read back.

Owns: `GreedySteps` -- launch a greedy step whose ids are host ints or the picks of the step
launched just before (still on the device), collect a step's picks, take a session's last step
back -- through the graph runner's captured steps, each batch size with two more graphs
taking turns (`_Graphs`), each taking its ids from the other's picks and ending in its own;
and `pipelined`, a
`backends/greedy.py` run on it.  Does not own: the plane bookkeeping (the runner's `_advance`,
`Plane.advance`), the step's maths, what a run means (backends/greedy.py), the server's rounds
(server/decode_rounds.py, which drives the same three calls).

The timeline; the host's bookkeeping for a step runs while the one before computes, and the
copies run on two side streams, so the main stream holds graphs back to back (`_Graphs`):

    host:  advance(N+1) upload(N+1) replay(N+1) | wait(N) read picks(N) settle(N) | advance(N+2)
    main:  ....... step N ........|.......... step N+1 .........|......... step N+2 ......
    ups:            up(N+1)                          up(N+2)
    downs:                         down(N)                        down(N+1)

A session that step N's pick ends (a stop id, a budget, a client gone) was already in step N+1,
which consumed that pick: `take_back` rewinds each plane to (len - 1, origins) -- metadata
only -- and drops the token from the lineage.  The rows kept are positions [origin, end - 1): a
ring (capacity = window) gives up nothing a later query reads (position end - 1 reads back to
end - window, the origin), a growing plane nothing at all.  The session then holds one old row
fewer than a step-by-step run leaves in a ring that wrapped: the same attention and the same
bits for every later token; a cut taken then has one row fewer.  Only a session's last step can
be taken back (a second would lose a row the next query reads).

A launch that fails leaves every session as it was, its batch size's turn where it was, and the
last step's picks where a later launch can still be fed them (`_replay`).
"""
from __future__ import annotations

import contextlib

import torch

from ..greedy import Budget, FromLast, Greedy, Step, greedy_rows, run_steps, take_back


class _Graphs:
    """One batch size's pipelined pieces, in two turns (a step's turn k alternates 0, 1): turn
    k's inputs packed[k] (positions and plane metas) and picks res[k] ([2, B]: token | ok) on the
    device, its graph (ids from res[1 - k][0] -> the step -> picks into res[k]), its pinned
    buffers up[k] / down[k], and the events that order three streams:

        ups:    wait downed[k] -> packed[k] <- up[k] -> copied[k]
        main:   wait copied[k] -> graph k -> done[k]
        downs:  wait done[k] -> down[k] <- res[k] -> downed[k]

    In the steady state nothing but graphs runs on the main stream: a copy between two graphs
    there cost ~10 us a step (benchmarks/greedy_tail.py).  Every buffer a graph writes is its
    turn's -- graph k + 1 writes res[k + 1] while res[k] goes down -- and the next graph k, which
    writes res[k] again, waits for copied[k], which waited for that copy (downed[k])."""

    def __init__(self, entry, device):
        B = entry.batch
        cuda = torch.device(device).type == "cuda"
        pin = (lambda t: t.pin_memory()) if cuda else (lambda t: t)
        two = range(2)
        self.res = [torch.zeros((2, B), dtype=torch.int64, device=device) for _ in two]
        self.packed = [torch.zeros_like(entry.packed) for _ in two]
        self.up = [pin(torch.zeros(entry.packed.shape, dtype=torch.int64)) for _ in two]
        self.down = [pin(torch.zeros((2, B), dtype=torch.int64)) for _ in two]
        # a step fed partly from the last step's picks: their rows there | their rows here
        self.sel = [pin(torch.zeros(2 * B, dtype=torch.int64)) for _ in two]
        self.sel_dev = torch.zeros(2 * B, dtype=torch.int64, device=device)
        event = (lambda: torch.cuda.Event()) if cuda else (lambda: None)
        self.copied, self.done, self.downed = ([event() for _ in two] for _ in range(3))
        self.ups = torch.cuda.Stream(device) if cuda else None
        self.downs = torch.cuda.Stream(device) if cuda else None
        for side in (self.ups, self.downs):
            if side is not None:               # the zero fills above run on the main stream:
                side.wait_stream(torch.cuda.current_stream())   # an upload must come after
        self.turn = 0
        self.graphs = [None, None]
        self.pick_ws = None                    # triton_pick's workspace (on the GPU)


def _on(stream):
    """`with _on(s):` -- work enqueued on stream s (None: the CPU, where there are no streams)."""
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def _wait(stream, event) -> None:
    """`stream` waits for `event` on the GPU (no host wait); nothing on the CPU."""
    if event is not None:
        (stream or torch.cuda.current_stream()).wait_event(event)


def _record(event, stream=None) -> None:
    if event is not None:
        event.record(stream or torch.cuda.current_stream())


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
        step = Step(list(sessions), (g, k, g.down[k], g.downed[k]))
        for s, f in zip(sessions, feeds):
            if isinstance(f, FromLast):
                self.last.consumers[f.row] = s     # a device pick joins the lineage at collect
            else:
                s.tokens.append(int(f))
        self.last = step
        return step

    def collect(self, step: Step) -> tuple[list[int], list[bool]]:
        """The step's picks and whether each row had a finite logit (waits for the step and the
        copy of its picks); the sessions that consumed a pick in a later step take it into
        their lineage."""
        _, _, down, downed = step.handle
        if downed is not None:
            downed.synchronize()
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
        k = g.turn                                # moves on only once the step is launched
        try:
            self._launch(r, entry, g, k, views, positions, metas, feeds)
        except BaseException:
            if self.last is not None and self.last.handle[0] is g:
                # the ids patch (`_ids`) may have overwritten the last step's picks in res:
                # back from their copy down, so that a later launch can still be fed them
                _wait(None, g.downed[1 - k])
                g.res[1 - k].copy_(g.down[1 - k], non_blocking=True)
            raise
        g.turn ^= 1
        return g, k

    def _launch(self, r, entry, g: _Graphs, k: int, views, positions, metas, feeds) -> None:
        """Turn k of `_replay`: the copies up, the ids, the graph, the copy down."""
        B = len(views)
        for ev in (g.copied[k], g.done[k]):       # turn k's last step has read up[k] and sel[k]
            if ev is not None:                    # (done at once in the steady state: its
                ev.synchronize()                  # picks were collected before this launch)
        flat = [0 if isinstance(f, FromLast) else int(f) for f in feeds] + list(positions)
        for grp in range(len(r.group_kinds)):
            for m in metas:
                flat.extend(m[2 * grp: 2 * grp + 2])
        g.up[k].numpy()[:] = flat
        with _on(g.ups):
            _wait(g.ups, g.downed[k])             # res[k]'s last copy down has run
            g.packed[k][B:].copy_(g.up[k][B:], non_blocking=True)
            _record(g.copied[k], g.ups)
        _wait(None, g.copied[k])
        r._upload_tables(entry, views)
        self._ids(g, k, B, feeds)
        if not r.capture:
            _graph_body(r, entry, g, k)
        else:
            if g.graphs[k] is None:
                # capture's warm-up runs the step once (rows the replay rewrites identically),
                # reading res[1 - k] and writing res[k] only
                g.graphs[k], _ = r.captured(lambda: _graph_body(r, entry, g, k))
            g.graphs[k].replay()
        r.stats["replays"] += 1
        _record(g.done[k])
        with _on(g.downs):
            _wait(g.downs, g.done[k])
            g.down[k].copy_(g.res[k], non_blocking=True)
            _record(g.downed[k], g.downs)

    def _ids(self, g: _Graphs, k: int, B: int, feeds) -> None:
        """This step's ids into res[1 - k][0], which graph k reads: host ints from up[k], device
        picks gathered from the last step's picks (first, in case they are this very buffer).
        Every copy comes from pinned memory, so none waits for the step in flight; the buffer
        is written only once its last copy down has run."""
        dev = [(i, f.row) for i, f in enumerate(feeds) if isinstance(f, FromLast)]
        last_g, last_k = self.last.handle[:2] if dev else (None, 0)
        if len(dev) == B and last_g is g and last_k == 1 - k \
                and [f for _, f in dev] == list(range(B)):
            return                                 # the last step's own picks, in order: in place
        n = len(dev)
        picks = None
        if n:
            g.sel[k].numpy()[:2 * n] = [f for _, f in dev] + [i for i, _ in dev]
            g.sel_dev[:2 * n].copy_(g.sel[k][:2 * n], non_blocking=True)
            picks = last_g.res[last_k][0].index_select(0, g.sel_dev[:n])
        ids = g.res[1 - k][0]
        _wait(None, g.downed[1 - k])
        ids.copy_(g.up[k][:B], non_blocking=True)
        if n:
            ids.index_copy_(0, g.sel_dev[n:2 * n], picks)


def _graph_body(runner, entry, g: _Graphs, k: int) -> torch.Tensor:
    """What greedy graph k holds: the step's ids from res[1 - k][0], the step on packed[k],
    its picks into res[k] (on the GPU in one launch, triton_pick.py; elsewhere -- the host
    tests -- through torch).  A step whose head can pick (DecodeStep.fused_pick) reads its ids
    in res and picks in the head: no id copy, no logits stored and read again."""
    B = entry.batch
    step = runner.step
    ids, packed, res = g.res[1 - k][0], g.packed[k], g.res[k]
    if step.fused_pick:
        return step.run(packed, entry.tables, entry.ws, ids=ids, pick=res)
    packed[:B].copy_(ids)
    logits = step.run(packed, entry.tables, entry.ws)                   # [B, vocab] float32
    if logits.is_cuda:
        from .triton_pick import PickWorkspace, pick_rows
        if g.pick_ws is None:
            g.pick_ws = PickWorkspace(B, logits.shape[1], logits.device)
        return pick_rows(logits, res, g.pick_ws, pdl=runner.step.pdl)
    best, ok = greedy_rows(logits)
    res.copy_(torch.stack([best, ok.long()]))
    return res


def pipelined(runner, sessions, run: Budget) -> Greedy:
    """`decode_loop`'s run with the host one step ahead (module doc)."""
    return run_steps(GreedySteps(runner), sessions, run)
