"""Compile the attention kernels for sm_90 without a GPU and fingerprint their code.

Two uses, both before a device call (benchmarks/NOTES.md, tenth session):
- **Does it compile on the device's Triton?**  The device runs Triton 3.6; this machine may have
  another.  `pip download triton==3.6.0 --no-deps -d /tmp/t36dl` and
  `pip install --no-deps --target /tmp/t36 /tmp/t36dl/triton-3.6.0-cp311-*.whl`, then run this
  with `PYTHONPATH=/tmp/t36:.`.  Integer args are marked divisible by 16 where the JIT would mark
  them (pointers, the view's strides): a compile without that missed a pipeliner failure.
- **Is a refactor neutral?**  `--out DIR` writes each configuration's PTX with its debug
  information stripped (line tables, labels), and prints a fingerprint per configuration; run it
  before and after a change: equal fingerprints are the same instructions, so the bits (and the
  speed) the device measured still hold.

- **Does a tile fit?**  `--regs` runs the wheel's ptxas on each PTX (`-v`) and prints its
  registers and spill bytes, and whether ptxas serialized the wgmmas (C7515); `--tiles` adds
  the 64-key attention tiles (ring and growing, decode and chunk, 4 and 8 warps) -- the ones
  `layout()` does not pick because a [BN, D] K/V tile at D = 256 spilled at 4 warps.
- **How does it move memory?**  `--io` counts the global loads and stores by width, the
  integer divisions and remainders (none in any configuration since the thirty-third session)
  and the async copies: 2-byte `ld.global.b16` by the hundred and no `cp.async` is a tile read
  one element at a time and never pipelined (the decode attention until the twelfth session: a
  pointer read from memory has no known alignment; `triton_attn.plane_at`).  Integer arguments
  the JIT would mark divisible by 16 at run time are not all marked here (N, B): a b16 store of
  a dot_rows output here can be a v4 store on the device.

    PYTHONPATH=/tmp/t36:. python3 benchmarks/sm90_ptx.py [--out DIR] [--regs] [--tiles] [--io]
"""
import argparse
import hashlib
import inspect
import re
from pathlib import Path

CHUNK = dict(H=4, KV=1, G=4, D=256, HALF=128, BLOCK_H=128, INTERLEAVED=False, BM=64, ROWS=16,
             BLOCK_N=32, SPLIT=32, GS=4, SOFTCAP=False, SINKS=False, RING=True, FLAT=True,
             DSPLIT=1, INTERIOR=True, ACC_DOT=True, TWO=True, DEV=True, ONE=True, PARK=False)
GROWING = dict(RING=False, FLAT=False, ONE=False, SPLIT=128, GS=16)
FOLD = dict(H=4, KV=1, G=4, D=256, HALF=128, BLOCK_H=128, INTERLEAVED=False, BM=32, ROWS=8,
            SPLIT=128, GS=16, SINKS=False, DEV=True)
DECODE = dict(H=4, KV=1, G=4, D=256, HALF=128, BLOCK_H=128, BLOCK_G=16, BLOCK_GC=4, BLOCK_N=32,
              NSPLIT=17, SPLIT=32, GS=4, DEPTH=4, FUSED=True, QK_NORM=True, ROPE=True,
              INTERLEAVED=False, SOFTCAP=False, SINKS=False, V_NORM=False, K_EQ_V=False,
              RING=True, ACC_DOT=True, PDL=True, PREP=False)
DOWN = dict(K=6912, KS=1024, BLOCK_N=128, BLOCK_K=64, GLU=False, GELU=False, HAS_BIAS=False,
            SPLIT=False, BM=128, PIECES_IN=7, WQ=False, PDL=True, FLATTEN=False,
            WIDEN=False, PICK=False)
ADD_NORM = dict(N=1152, BLOCK=2048, HAS_D1=True, HAS_D2=False, POST=True, LAYERNORM=False,
                NEXT=True, PDL=True)
EMBED_NORM = dict(N=1152, BLOCK=2048, SCALED=True, LAYERNORM=False, NEXT=True, PDL=True)
ADD_PIECES = dict(N=1152, BLOCK=2048, PIECES=7, WQ=False, POST=True, LAYERNORM=False, NEXT=True,
                  PDL=True)
PICK = dict(CHUNK=8192, BLOCK=1024, NBP=32, BIG=3.4028234663852886e38, PDL=True)
# the 1B's global layers on the flat aligned wide route: an eager chunk, and a captured pass
# over one ordered view (MUSER_GRAPH_KEYS=staged, told its alignment)
WIDE_EAGER = {**GROWING, "FLAT": True, "TWO": False, "DEV": False, "ALIGN": True, "LIVE": True,
              "BM": 128, "ROWS": 32, "DSPLIT": 2, "HEAVY": True}
WIDE_STAGED = {**GROWING, "FLAT": True, "ALIGN": True, "LIVE": True, "BM": 128, "ROWS": 32,
               "DSPLIT": 2, "HEAVY": True, "TWO": False, "HINTS": True}
# (name, kernel, constexprs, warps): the 1B's shapes on the routes the engine takes
CONFIGS = [
    ("chunk ring flat captured", "chunk", {}, 8),
    ("chunk ring flat eager", "chunk", dict(TWO=False, DEV=False), 8),
    ("chunk growing flat eager aligned, wide (128 slots, 2 halves)", "chunk",
     {**GROWING, "FLAT": True, "TWO": False, "DEV": False, "ALIGN": True, "LIVE": True,
      "BM": 128, "ROWS": 32, "DSPLIT": 2}, 8),
    ("chunk growing flat eager aligned, heavy first", "chunk",
     {**GROWING, "FLAT": True, "TWO": False, "DEV": False, "ALIGN": True, "LIVE": True,
      "HEAVY": True}, 8),
    ("chunk growing flat captured aligned, wide, heavy", "chunk",
     {**GROWING, "FLAT": True, "ALIGN": True, "LIVE": True, "BM": 128, "ROWS": 32, "DSPLIT": 2,
      "HEAVY": True}, 8),
    ("chunk growing flat eager aligned, wide, heavy", "chunk",
     WIDE_EAGER, 8),
    ("chunk ring flat captured wide", "chunk", dict(BM=128, ROWS=32, DSPLIT=2), 8),
    # MUSER_GRAPH_KEYS=staged: captured passes over one ordered view, told its alignment
    ("chunk growing flat captured aligned, wide, heavy, staged", "chunk",
     WIDE_STAGED, 8),
    ("chunk sliding flat captured wide, staged shadow", "chunk",
     dict(BM=128, ROWS=32, DSPLIT=2, TWO=False, RING=False, HINTS=True), 8),
    ("chunk sliding flat eager wide (ordered shadow)", "chunk",
     dict(BM=128, ROWS=32, DSPLIT=2, TWO=False, DEV=False, RING=False), 8),
    # MUSER_CHUNK_FENCE=off: every flat aligned row above and below takes the fence (the
    # default, `as_launched`); these two without it (nor whole tiles: the thirtieth session's
    # default before both) -- ptxas serializes every wgmma (C7515)
    ("chunk growing flat eager aligned, wide, heavy, unfenced", "chunk",
     {**WIDE_EAGER, "FENCE": False, "WHOLE": False}, 8),
    ("chunk growing flat captured aligned, wide, heavy, staged, unfenced", "chunk",
     {**WIDE_STAGED, "FENCE": False, "WHOLE": False}, 8),
    # MUSER_CHUNK_WHOLE=off: the same defaults with the whole tiles' row masks
    ("chunk growing flat eager aligned, wide, heavy, masked tiles", "chunk",
     {**WIDE_EAGER, "WHOLE": False}, 8),
    ("chunk growing flat captured aligned, wide, heavy, staged, masked tiles", "chunk",
     {**WIDE_STAGED, "WHOLE": False}, 8),
    # MUSER_CHUNK_BASE=off (on, the default since the thirty-second session, addresses the
    # whole tiles from one base a program: a captured pass's spills 208 -> 144 B)
    ("chunk growing flat eager aligned, wide, heavy, unbased", "chunk",
     {**WIDE_EAGER, "BASE": False}, 8),
    ("chunk growing flat captured aligned, wide, heavy, staged, unbased", "chunk",
     {**WIDE_STAGED, "BASE": False}, 8),
    ("chunk growing nested captured", "chunk", GROWING, 8),
    ("chunk growing nested eager softcap", "chunk", {**GROWING, "TWO": False, "DEV": False,
                                                      "SOFTCAP": True}, 8),
    ("chunk growing flattened captured", "chunk", {**GROWING, "FLATTEN": True}, 8),
    ("chunk growing nested eager aligned, no keeping select", "chunk",
     {**GROWING, "TWO": False, "DEV": False, "ALIGN": True}, 8),
    ("chunk growing nested eager aligned, no selects", "chunk",
     {**GROWING, "TWO": False, "DEV": False, "ALIGN": True, "LIVE": True}, 8),
    ("chunk growing flat eager aligned, no selects", "chunk",
     {**GROWING, "FLAT": True, "TWO": False, "DEV": False, "ALIGN": True, "LIVE": True}, 8),
    ("chunk growing parked", "chunk", {**GROWING, "PARK": True, "BM": 16, "ROWS": 4}, 4),
    ("chunk ring parked", "chunk", dict(PARK=True, BM=32, ROWS=8), 4),
    ("graph rows: a chunk's rows placed (1B: KV 1, D 256)", "place", {}, 4),
    ("graph rows: a ring's shadow gathered", "shadow", {}, 4),
    ("decode ring fused", "decode", {}, 4),
    ("decode growing fused", "decode", dict(NSPLIT=257, SPLIT=128, GS=16, RING=False), 4),
    ("decode growing fused, 32-key splits", "decode", dict(NSPLIT=1025, SPLIT=32, GS=16,
                                                          RING=False), 4),
    ("decode ring q-given", "decode", dict(FUSED=False, QK_NORM=False, ROPE=False), 4),
    ("decode ring prepare alone", "decode", dict(PREP=True), 4),
    ("decode ring fused, <= 168 registers", "decode", dict(maxnreg=168), 4),
    # MUSER_PREFETCH: the launch's extra row asks for the layer's next weights (l2_prefetch.py)
    ("decode ring fused, L2 prefetch row", "decode", dict(NPF=32, PF_LANES=128), 4),
    # MUSER_ATTN_EARLY: the prologue's loads before the PDL wait, idle splits leave before it
    ("decode ring fused, early prologue", "decode", dict(EARLY=True), 4),
    ("decode growing fused, early prologue, L2 prefetch row", "decode",
     dict(NSPLIT=257, SPLIT=128, GS=16, RING=False, NPF=32, PF_LANES=128, EARLY=True), 4),
    ("decode growing fused, <= 168 registers", "decode", dict(NSPLIT=257, SPLIT=128, GS=16,
                                                             RING=False, maxnreg=168), 4),
    ("dot_rows down 128-row tile, 7 pieces in", "dot", {}, 8),
    ("dot_rows down, pieces flattened", "dot", dict(FLATTEN=True), 8),
    ("dot_rows qkv 16-row decode tile", "dot", dict(K=1152, KS=1152, BM=16, BLOCK_N=32,
                                                    BLOCK_K=256, PIECES_IN=1), 4),
    ("dot_rows gate|up 16-row decode tile", "dot", dict(K=1152, KS=1152, BM=16, BLOCK_N=32,
                                                        BLOCK_K=256, PIECES_IN=1, GLU=True,
                                                        GELU=True), 4),
    ("dot_rows down 16-row decode tile, pieces apart", "dot",
     dict(K=6912, KS=1024, BM=16, BLOCK_N=32, BLOCK_K=256, PIECES_IN=1, SPLIT=True), 4),
    ("dot_rows head, 16-row tile, widened", "dot", dict(K=1152, KS=1152, BM=16, BLOCK_N=64,
                                                        BLOCK_K=128, PIECES_IN=1, WIDEN=True), 4),
    ("dot_rows head, 16-row tile, picking", "dot", dict(K=1152, KS=1152, BM=16, BLOCK_N=64,
                                                        BLOCK_K=128, PIECES_IN=1, WIDEN=True,
                                                        PICK=True), 4),
    # quant="int8-head": the head as int8 blocks of 32 keys with float16 scales (BlockInt8)
    ("dot_rows head, 16-row tile, picking, block int8", "dot",
     dict(K=640, KS=640, BM=16, BLOCK_N=64, BLOCK_K=128, PIECES_IN=1, WIDEN=True, PICK=True,
          WQB=True, FENCE=True, _types={"W": "*i8", "S": "*fp16", "Y": "*fp32", "P": "*i64"}), 4),
    # quant="int8": a layer's projection as int8 rows with float32 scales, behind the fence
    ("dot_rows qkv 16-row decode tile, int8 rows", "dot",
     dict(K=1152, KS=1152, BM=16, BLOCK_N=16, BLOCK_K=256, PIECES_IN=1, WQ=True, FENCE=True,
          _types={"W": "*i8", "S": "*fp32"}), 4),
    ("dot_rows head, 16-row tile, picking, 270M", "dot",
     dict(K=640, KS=640, BM=16, BLOCK_N=64, BLOCK_K=128, PIECES_IN=1, WIDEN=True, PICK=True,
          _types={"Y": "*fp32", "P": "*i64"}), 4),
    # quant="int8-head-fast": the head as int8 rows with float32 scales, NOT behind the fence --
    # Triton's own int8 operand layout (kWidth 4), k permuted in each MMA: every head row of the
    # mode goes through this one tile (decode_step.DecodeStep._dot), so no other order meets it
    ("dot_rows head, 16-row tile, widened, int8 rows unfenced (int8-head-fast)", "dot",
     dict(K=640, KS=640, BM=16, BLOCK_N=64, BLOCK_K=128, PIECES_IN=1, WIDEN=True, WQ=True,
          _types={"W": "*i8", "S": "*fp32", "Y": "*fp32"}), 4),
    ("dot_rows head, 16-row tile, picking, int8 rows unfenced (int8-head-fast)", "dot",
     dict(K=1152, KS=1152, BM=16, BLOCK_N=64, BLOCK_K=128, PIECES_IN=1, WIDEN=True, PICK=True,
          WQ=True, _types={"W": "*i8", "S": "*fp32", "Y": "*fp32", "P": "*i64"}), 4),
    ("greedy pick from a picking head", "fold_pick", {}, 4),
    ("embed + first norm", "embed_norm", {}, 4),
    # CUDA's default for a tied Q8_0 head: the lookup from its blocks (weights_int8.EmbedBlocks)
    ("embed + first norm, Q8_0 rows", "embed_norm",
     dict(N=640, BLOCK=1024, Q8=True, _types={"E": "*i8", "ES": "*fp16"}), 4),
    ("add_norm sandwich", "add_norm", {}, 4),
    ("add_norm sandwich, 270M", "add_norm", dict(N=640, BLOCK=1024), 4),
    ("add_norm first layer", "add_norm", dict(HAS_D1=False, POST=False), 4),
    ("add_norm parallel", "add_norm", dict(HAS_D2=True, POST=False), 4),
    ("add_norm over 7 pieces", "add_pieces", {}, 4),
    ("greedy pick, 262k columns", "pick", {}, 4),
    ("qk-norm + RoPE + store (MUSER_ATTN=separate)", "qk_rope", {}, 4),
    ("qk-norm + RoPE + store, interleaved", "qk_rope", dict(INTERLEAVED=True), 4),
    ("chunk rows: norm + RoPE", "norm_rope", {}, 4),
    ("chunk rows: RoPE interleaved", "norm_rope", dict(NORM=False, INTERLEAVED=True), 4),
    ("fold growing captured", "fold", {}, 4),
    ("fold ring eager sinks", "fold", dict(SINKS=True, DEV=False, BM=16, ROWS=4, SPLIT=32, GS=4),
     4),
]
# 64-key tiles (MUSER_ATTN_RING / MUSER_ATTN_GROWING = 64,W with MUSER_RING_ROWS = 64): a
# ring split stays one tile, half as many splits; a growing split of 128 is two tiles
TILES = [
    (f"{what} {w} warps", kern, over, w)
    for w in (4, 8)
    for what, kern, over in (
        ("decode ring BN64", "decode", dict(BLOCK_N=64, SPLIT=64, NSPLIT=9)),
        ("decode growing BN64", "decode", dict(BLOCK_N=64, NSPLIT=257, SPLIT=128, GS=16,
                                               RING=False)),
        ("chunk ring flat captured BN64", "chunk", dict(BLOCK_N=64, SPLIT=64)),
        ("chunk growing nested captured BN64", "chunk", {**GROWING, "BLOCK_N": 64}),
        ("chunk ring parked BN64", "chunk", dict(BLOCK_N=64, SPLIT=64, PARK=True, BM=32,
                                                 ROWS=8)))
]
TYPES = {  # argument types as the engine passes them (others are i32)
    # chunk attention and the fold
    "Q": "*bf16", "K": "*bf16", "V": "*bf16", "O": "*bf16", "SNK": "*bf16", "K2": "*bf16",
    "V2": "*bf16", "MS": "*fp32", "LS": "*fp32", "ACC": "*fp32", "TAB": "*i64", "META": "*i64",
    "scale": "fp32", "softcap": "fp32",
    # a captured chunk pass's row moves (triton_graph_rows.py)
    "SK": "*bf16", "SV": "*bf16", "DK": "*bf16", "DV": "*bf16",
    # decode attention
    "QKV": "*bf16", "POS": "*i64", "COS": "*fp32", "SIN": "*fp32", "QN": "*bf16", "KN": "*bf16",
    "CNT": "*i32", "QOUT": "*bf16", "eps": "fp32", "PF0": "i64", "PF1": "i64", "PF2": "i64",
    # dot_rows (S: the weights again for bf16) and add_norm (P: split-K pieces, float32)
    "X": "*bf16", "W": "*bf16", "S": "*bf16", "BIAS": "*bf16", "Y": "*bf16", "P": "*fp32",
    "H": "*bf16", "D1": "*bf16", "D2": "*bf16", "W_POST": "*fp32", "W_NEXT": "*fp32",
    "H_OUT": "*bf16", "X_OUT": "*bf16", "IDS": "*i64", "E": "*bf16", "SCALE": "*bf16",
    # the greedy pick (triton_pick.py)
    "L": "*fp32", "VALS": "*fp32", "IDX": "*i64", "RES": "*i64",
    # qk-norm + RoPE + store (triton_ops.py) and a chunk's rows (triton_rows.py)
    "Q_OUT": "*bf16", "OUT": "*bf16",
}
QK_ROPE = dict(H=4, KV=1, D=256, HALF=128, BLOCK=128, QK_NORM=True, ROPE=True, INTERLEAVED=False)
NORM_ROPE = dict(N=4, D=256, HALF=128, BN=4, BH=128, NORM=True, LAYERNORM=False, ROPE=True,
                 INTERLEAVED=False)
CHUNK["FLATTEN"] = False
DIVISIBLE = set(TYPES) - {"scale", "softcap", "eps"} | {"rs", "hs"}


def compile_ptx(kern, consts: dict, warps: int, asm: str = "ptx") -> str:
    """`consts` may carry "maxnreg": a register cap (a launch option, not a kernel argument).
    `asm`: which of Triton's stages to return ("ttgir": the layouts Triton chose, e.g. a dot
    operand's kWidth -- tests/cuda/test_int8_tiles.py reads it)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    consts = dict(consts)
    cap = consts.pop("maxnreg", None)
    types = {**TYPES, **consts.pop("_types", {})}        # a configuration's own argument types
    params = inspect.signature(kern.fn).parameters
    names = list(params)
    # a constexpr with a default the launch leaves out is that default, as the JIT compiles it
    # (left out here it became a runtime i32, and both sides of its `if` were compiled)
    consts = {**{n: p.default for n, p in params.items()
                 if p.default is not inspect.Parameter.empty and "constexpr" in str(p.annotation)},
              **consts}
    sig = {n: "constexpr" if n in consts else types.get(n, "i32") for n in names}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names if n in DIVISIBLE}
    src = ASTSource(fn=kern, signature=sig, attrs=attrs,
                    constexprs={(names.index(k),): v for k, v in consts.items()})
    out = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                         # as launched: attention without FMA contraction, bf16 dot_rows and
                         # add_norm with it (dot_rows turns it off for int8 weights), 3 stages
                         options={"num_warps": warps, "num_stages": 3,
                                  "enable_fp_fusion": ("K" in consts or "NEXT" in consts)
                                  and not (consts.get("WQ") or consts.get("WQB")),
                                  **({"maxnreg": cap} if cap else {})})
    return out.asm[asm]


def as_launched(which: str, over: dict) -> dict:
    """A flat aligned chunk route (FLAT and LIVE) as the engine launches it on the GPU: with the
    fence before its split-end branch (MUSER_CHUNK_FENCE=on, the default), and on an ordered
    view (no second buffer: TWO False) its whole tiles without row masks (MUSER_CHUNK_WHOLE=on,
    the default), addressed from one base (MUSER_CHUNK_BASE=on, the default) -- unless the row
    says."""
    if which == "chunk" and over.get("FLAT") and over.get("LIVE"):
        whole = {"WHOLE": True} if over.get("TWO", True) is False else {}
        out = {"FENCE": True, **whole, **over}
        return {"BASE": bool(out.get("WHOLE")), **out}
    return over


def ptxas_usage(ptx: str) -> str:
    """ptxas -v's verdict on the PTX (the wheel's ptxas, sm_90a as Triton compiles it):
    registers and spill bytes."""
    import os
    import subprocess
    import tempfile

    import triton
    exe = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        Path(src).write_text(ptx)
        r = subprocess.run([str(exe), "-v", "--gpu-name", "sm_90a", src, "-o",
                            os.path.join(d, "k.cubin")], capture_output=True, text=True)
    text = r.stdout + r.stderr
    regs = re.search(r"Used (\d+) registers", text)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    if regs is None:
        return "ptxas: " + text.strip().splitlines()[-1][:80] if text.strip() else "ptxas: ?"
    # C7515: ptxas serialized the wgmmas (a non-wgmma instruction reads or defines an
    # accumulator inside a wgmma's pipeline stage) -- the thirtieth session's find: the global
    # layers' chunk binaries had it for six sessions, unread; C7514 the same for a read only
    # (the thirty-first session's Gluon probe: an async wgmma across a runtime branch)
    code = re.search(r"C751[45]", text)
    serial = f", WGMMA SERIALIZED ({code.group(0)})" if code else ""
    return (f"{regs.group(1)} regs, spills {spill.group(1)}/{spill.group(2)} B" if spill else
            f"{regs.group(1)} regs") + serial


def io_counts(ptx: str) -> str:
    """Global loads / stores by width, and async copies: "ld.b16 x134 ld.v4 x8 cp.async x48"."""
    kinds = re.findall(r"\b(ld\.global|st\.global)((?:\.[a-z]+)*?)\.(v[248]\.)?([bfsu]\d+)", ptx)
    counts: dict[str, int] = {}
    for op, _mods, vec, width in kinds:
        key = f"{op.split('.')[0]}.{vec}{width}"
        counts[key] = counts.get(key, 0) + 1
    counts["cp.async"] = len(re.findall(r"cp\.async\.c[ag]\.shared\.global", ptx))
    # integer division / remainder: ~20 instructions each even on the 32-bit fast path (a ring
    # decode launch's int64 `%` was a quarter of its instructions, thirty-third session)
    counts["int div/rem"] = len(re.findall(r"\b(?:div|rem)\.[su](?:32|64)\b", ptx))
    return " ".join(f"{k} x{v}" for k, v in sorted(counts.items()) if v)


def code_only(ptx: str) -> str:
    """The instructions: no DWARF tables, line markers, comments or debug label numbers."""
    keep = []
    for line in ptx.splitlines():
        s = line.strip()
        if s.startswith((".b8", ".b32", ".b64", ".loc", ".file", "//")) or "DW_" in s:
            continue
        if re.fullmatch(r"\$L__tmp\d+:", s):
            continue
        keep.append(re.sub(r"\$L__tmp\d+", "$L__tmp", line))
    return "\n".join(keep)


def kernel_table() -> dict:
    """Each configuration's `which` -> (its Triton kernel, the base constexprs)."""
    from muser.backends.cuda.triton_chunk_kernel import _kernel
    from muser.backends.cuda.triton_chunk_park import _fold_kernel
    from muser.backends.cuda.triton_decode_kernel import _kernel as _decode_kernel
    from muser.backends.cuda.triton_dot import _kernels as _dot_kernels
    from muser.backends.cuda.triton_ops import _kernels as _ops_kernels
    from muser.backends.cuda.triton_pick import _kernel as _pick_kernel
    from muser.backends.cuda.triton_rows import _kernels as _rows_kernels
    from muser.backends.cuda.triton_graph_rows import _kernels as _graph_rows
    return {"chunk": (_kernel(), CHUNK), "fold": (_fold_kernel(), FOLD),
            "decode": (_decode_kernel(), DECODE), "dot": (_dot_kernels()[0], DOWN),
            "add_norm": (_ops_kernels()[0], ADD_NORM),
            "add_pieces": (_ops_kernels()[2], ADD_PIECES),
            "embed_norm": (_ops_kernels()[3], EMBED_NORM), "pick": (_pick_kernel()[0], PICK),
            "fold_pick": (_pick_kernel()[1], dict(BLOCK=1024, PDL=True)),
            "qk_rope": (_ops_kernels()[1], QK_ROPE),
            "norm_rope": (_rows_kernels()[0], NORM_ROPE),
            "place": (_graph_rows()[0], dict(KVD=256, D=256, BLOCK=256)),
            "shadow": (_graph_rows()[1], dict(KVD=256, D=256, BLOCK=256))}


def mma_layouts() -> dict:
    """Each configuration's dot operand layouts as Triton chose them (TTGIR `kWidth = n`, an
    empty list where the operands come from shared memory): every MMA must sum its k in the
    one order all tiles share (tests/cuda/test_int8_tiles.py)."""
    kernels = kernel_table()
    out = {}
    for name, which, over, warps in CONFIGS:
        kern, base = kernels[which]
        ttgir = compile_ptx(kern, {**base, **as_launched(which, over)}, warps, asm="ttgir")
        out[name] = sorted(set(re.findall(r"kWidth = [0-9]+", ttgir)))
    return out


def main():
    import triton
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="write each configuration's stripped PTX here")
    ap.add_argument("--regs", action="store_true", help="ptxas -v: registers and spills")
    ap.add_argument("--tiles", action="store_true", help="also the 64-key attention tiles")
    ap.add_argument("--io", action="store_true", help="global loads / stores by width, cp.async")
    args = ap.parse_args()
    kernels = kernel_table()
    print(f"triton {triton.__version__}, sm_90")
    compiled = {}
    for name, which, over, warps in CONFIGS + (TILES if args.tiles else []):
        kern, base = kernels[which]
        over = as_launched(which, over)
        try:
            ptx = compile_ptx(kern, {**base, **over}, warps)
        except Exception as e:              # a compile failure is this tool's answer, not a crash
            print(f"  {name:40s} FAILED: {str(e)[-900:]}")
            continue
        code = compiled[name] = code_only(ptx)
        usage = f"  {ptxas_usage(ptx)}" if args.regs else ""
        usage += f"  [{io_counts(ptx)}]" if args.io else ""
        print(f"  {name:40s} {hashlib.sha1(code.encode()).hexdigest()[:12]}  {len(code):7d} chars"
              + usage)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / (name.replace(" ", "_") + ".ptx")).write_text(code)


if __name__ == "__main__":
    main()
