"""Capturing a CUDA graph the way every captured thing here is captured.

Owns: `capture(fn, pool)` -- run `fn` once eagerly on a side stream (Triton compiles its
kernels, allocators settle), then capture a second call into a graph drawing on `pool`.
Does not own: what is captured (graph.py's decode steps, chunk_graph.py's single-session chunks) or
when to replay it.
"""
from __future__ import annotations

import torch


def capture(fn, pool):
    """(graph, fn's output inside the graph's memory).  The warm-up's effects must be ones the
    replay repeats identically (both callers' warm-ups write rows a replay rewrites)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn()
    return graph, out
