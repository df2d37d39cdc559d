"""Every MUSER_* environment variable as data: what it is called, what it takes, its default,
who reads it and what it does.

Owns: `KNOBS` (the single source of truth for docs/env.md, which `table()` prints and a test
checks), `RENAMED` (old names still refused) and `REMOVED` / `REMOVED_DEFAULT` (experiment
switches measured slower and taken out, refused unless set to off or their old default).
Does not own: parsing or refusing values (muser/env.py's `read`, which imports this table and
nothing else does) or deciding anything from them.  No imports: a table, readable without
torch or Triton.
"""
from __future__ import annotations

# name -> (type, default, read by, meaning).  The single source of truth for docs/env.md.
KNOBS: dict[str, tuple[str, str, str, str]] = {
    "MUSER_CACHE_DIR": ("path", "~/.cache/muser", "native kernels, weight digests, test references",
                        "where muser keeps what it can rebuild: native/ (compiled CPU kernels), "
                        "digests.json (weight-file SHA-256s), test-reference/ (tests only)"),
    "MUSER_NATIVE": ("bool", "1", "backends/cpu (model/native_build.py)",
                     "0: never build or load the native CPU kernels; aten and eager ops instead"),
    "MUSER_PACK_KEY": ("text", "unset", "pack, generate, serve",
                       "HMAC key for session packs (UTF-8) when no key file is given"),
    "MUSER_API_KEY": ("text", "unset", "serve",
                      "bearer key the server requires on /v1 when --api-key is not given"),
    "MUSER_ROWS": ("fused|eager", "fused", "backends/cuda (ops)",
                   "CUDA chunks: Triton row kernels for norms, residual adds, qk-norm + RoPE, act*up; "
                   "eager = the plain-torch maths (A/B runs)"),
    "MUSER_GEMV": ("dot|fast|none", "dot", "backends/cuda (decode step)",
                   "CUDA decode projections and head: dot = the batch-invariant dot_rows kernel "
                   "(batched decode == alone, bitwise); fast = the batch-1 GEMV, cuBLAS for larger "
                   "batches and the head (NOT batch-invariant); none = cuBLAS for all"),
    "MUSER_ATTN": ("fused|separate", "fused", "backends/cuda (decode step)",
                   "CUDA decode attention: one launch with qk-norm + RoPE + store, or two"),
    "MUSER_CHUNKS": ("exact|fast", "exact", "backends/cuda (step driver)",
                     "CUDA chunks (prefill, verification blocks): exact = the decode step's kernels, "
                     "a row's bits never depend on its chunk; fast = cuBLAS + FlashAttention, a "
                     "faster prefill whose rows differ from decoded ones in the last bits (its own "
                     "cut encoding)"),
    "MUSER_RING_ROWS": ("int >= 1", "32", "backends/cuda (attention)",
                        "positions per split of a ring plane's attention (rounded up to whole "
                        "tiles; part of the arithmetic: experiments; H200, 1B: 64 / 128 cost "
                        "decode +2.6 / +11% and the 16k prefill -3 / -4%)"),
    "MUSER_GROWING_ROWS": ("int >= 1", "128", "backends/cuda (attention)",
                           "positions per split of a growing plane's attention (rounded up to "
                           "whole tiles; part of the arithmetic: experiments)"),
    "MUSER_RING_GROUP": ("int >= 1", "4", "backends/cuda (attention)",
                         "ring splits per first-level merge group (a decode merge folds groups "
                         "in parallel, then the groups; part of the arithmetic: experiments; "
                         "H200, 1B: 2 / 8 / 16 even with 4 or slower)"),
    "MUSER_GROWING_GROUP": ("int >= 1", "16", "backends/cuda (attention)",
                            "growing-plane splits per first-level merge group (part of the "
                            "arithmetic: experiments)"),
    "MUSER_MERGE_LOADS": ("1|4", "4", "backends/cuda (decode attention)",
                          "parked split partials loaded at once by a decode merge (the same "
                          "bits either way; H200: 4 is 5% faster for a ring layer at 2k, 10% "
                          "for a global layer at 32k)"),
    "MUSER_CHUNK_LOOP": ("auto|nested|flat", "auto", "backends/cuda (chunk attention)",
                         "the chunk attention's loop: splits then tiles, or one loop over the tiles "
                         "(the same bits; auto: flat on rings, on growing splits of one tile "
                         "and on aligned growing runs (MUSER_CHUNK_ALIGN=on), nested on other "
                         "growing chunks -- the faster of each on the H200)"),
    "MUSER_CHUNK_ORDER": ("light|heavy", "heavy", "backends/cuda (chunk attention)",
                          "the order a chunk's query tiles start in on a growing plane: first "
                          "rows first (light) or last rows -- the most keys -- first (heavy), "
                          "so the long programs do not finish alone at the end (the same bits: "
                          "each program's work is its own; H200, a 1B global layer's 16k chunk "
                          "3.95 -> 3.52 ms)"),
    "MUSER_CHUNK_FENCE": ("off|on", "on", "backends/cuda (chunk attention)",
                          "on: the flat loop on aligned growing runs copies p @ V's result "
                          "through an opaque move before its split-end branch, so the wgmma is "
                          "waited for there and ptxas keeps the other wgmmas pipelined (off: "
                          "ptxas serializes every wgmma of the kernel, C7515); the same bits "
                          "(a move copies them; H200, a global layer's 16k chunk 3.75 -> 3.27 "
                          "ms)"),
    "MUSER_CHUNK_WHOLE": ("off|on", "on", "backends/cuda (chunk attention)",
                          "on: the flat loop on aligned growing runs loads the key tiles every "
                          "row sees whole without row masks (an ordered view; the same values) "
                          "-- ~100 fewer addressing instructions a loop (H200, a global "
                          "layer's 16k chunk 3.26-3.45 -> 2.87-2.94 ms)"),
    "MUSER_CHUNK_BASE": ("off|on", "on", "backends/cuda (chunk attention)",
                         "on: the flat aligned loop's whole tiles address the view from one base "
                         "a program (K + kvh * hs - first * rs) instead of keeping K, first, kvh "
                         "and hs live -- the same addresses; sm_90: a captured pass's spills "
                         "208 -> 144 B, the loop's local loads / stores 18 -> 10 (H200, 16k "
                         "chunk attention 17.9 -> 17.7 ms on the 1B, 12.5 -> 12.2 on the 270M; "
                         "bits equal)"),
    "MUSER_CHUNK_WIDE": ("off|on", "on", "backends/cuda (chunk attention)",
                         "at head dims of 256, each warpgroup owns whole rows of the score tile "
                         "(a launch shape, the same bits; chunk_route.py): aligned runs at 4 "
                         "query heads a KV head take 128 query slots in two value-column halves "
                         "(H200, a 1B global layer's 16k chunk 5.39 -> 3.95 ms), at 2 heads 64 "
                         "slots at 4 warps in halves (10.1 -> 8.3 ms), and sliding layers at 2 "
                         "and 4 heads 128 slots in halves (0.40 -> 0.30 ms at 4, 1.38 -> 1.03 "
                         "at 2); eager and captured chunks alike"),
    "MUSER_CHUNK_ALIGN": ("off|tiles|on", "on", "backends/cuda (chunk attention)",
                          "chunks over a growing plane (eager and captured): each program "
                          "takes an aligned run of positions, so every row sees a key of every "
                          "tile it walks and the "
                          "selects that keep a row's state where it sees none are left out "
                          "(tiles: tile_step's; on: merge_one's too) -- the same bits by "
                          "construction (H200: a 1B global layer's 16k chunk 6.77 -> 5.63 ms, "
                          "the 16k prefill 203k -> 215k tok/s, logits and K/V rows equal)"),
    "MUSER_CHUNK_COLUMNS": ("1|2|4", "1", "backends/cuda (chunk attention)",
                            "programs per query tile, each with a slice of the value columns "
                            "(the same bits: fewer accumulator registers, scores recomputed)"),
    "MUSER_CHUNK_FIRST": ("off|on", "on", "backends/cuda (chunk attention)",
                          "on: where a chunk's splits are one key tile each (rings), each starts "
                          "from tile_first -- no running state to reset or rescale (the same bits; "
                          "H200, 1B: prefill 512 68.4k -> 72.6k tok/s, 16k 168k -> 173k)"),
    "MUSER_CHUNK_PARK": ("0|8|16|32|64", "16", "backends/cuda (chunk attention)",
                         "chunks of up to this many rows (verification blocks) spread their key "
                         "splits over programs, one each, and fold the parked partials in a "
                         "second launch -- as a decode step does (the same bits; 0: one program "
                         "walks a query tile's splits in order; H200, 1B at 2k: a 1-16 row "
                         "verification block 5.5 -> 2.0-2.7 ms)"),
    "MUSER_CHUNK_PREP": ("decode|alone", "alone", "backends/cuda (chunk attention)",
                         "a chunk's q/k/v preparation (qk-norm, RoPE, the rows stored): decode = "
                         "the decode attention launch itself, told to attend over nothing; alone "
                         "= the same kernel source compiled without its attention half (the "
                         "same bits; H200, 1B: the 16k prefill's preparation 3.5 -> 1.4 ms, "
                         "prefill 512 73.6k -> 75.9k tok/s, 16k 174k -> 177k)"),
    "MUSER_FLATTEN": ("off|dot|chunk|on", "dot", "backends/cuda (dot_rows, chunk attention)",
                      "nested loops that Triton fuses into one software-pipelined loop "
                      "(tl.range flatten) -- the same arithmetic in the same order: dot = a "
                      "prefill tile's split-K pieces summed in the kernel (H200, 1B: the 16k "
                      "prefill's dot_rows 47.2 -> 46.3 ms); chunk = the chunk attention's "
                      "splits on growing planes (fixed tile bounds, the group merge as selects; "
                      "slower: 36 -> 51 ms); on = both"),
    "MUSER_DOT_CPP": ("off|on|norm|11|21|41|12|22", "off", "backends/cuda (decode step, cpp_dot.py)",
                      "an experiment, measured slower (H100, thirty-ninth session: the same bits, "
                      "the step +34 us on the 270M, +85 on the 1B; norm more): the decode step's "
                      "projections of up "
                      "to 16 rows (qkv, o, gate|up with GELU, down as deferred pieces; not the "
                      "head; bf16 weights or quant=int8 rows) through the CUDA C++ kernel "
                      "csrc/gemv_mma.cu, built by nvcc for "
                      "sm_90a into $MUSER_CACHE_DIR/native/cuda on first use -- dot_rows' decode "
                      "tile's arithmetic, so the same bits (tests/cuda/test_cpp_dot.py), with "
                      "the weights asked for by bulk copies before the PDL wait; on = 2 warps x "
                      "1 n8 tile a CTA (1 x 1 where shared memory is short), two digits = warps "
                      "and n8 tiles a warp; norm = on, and the add+norm before qkv and gate|up "
                      "made inside them (every CTA norms the row in add_norm's own reduction "
                      "tree while its weights land, one stores h': Gemma 3's sandwich layers, "
                      "step_norm.py); without nvcc or an sm_90 GPU a warning and the Triton "
                      "tiles"),
    "MUSER_DOT_TMA": ("off|auto|on", "auto", "backends/cuda (dot_rows)",
                      "on: a prefill chunk's 128-row dot_rows tiles (16-bit weights) load by TMA "
                      "(tensor descriptors, triton_dot_tma.py) -- the same pieces, dots and "
                      "epilogue, so the same bits; auto: weights of 4M elements or more, and every "
                      "weight in chunks of 64-2,048 rows and of a long bucket's length, which run "
                      "as captured graphs (triton_dot_tiles.tma_pays: a TMA launch costs the host "
                      "~20-35 us more, paid once in a graph; H200, 16k prefill: 1B 179k -> 199k "
                      "tok/s eager; in the 16k graph the 270M 603-615k -> 630-645k); before "
                      "sm_90 always off"),
    "MUSER_FUSE_SUM": ("off|on", "on", "backends/cuda (decode step)",
                       "on: where the down projection leaves split-K pieces (decode tiles), the "
                       "add+norm after it sums them (split_sum's adds, in order) -- one launch a "
                       "layer fewer, the same bits (H200: bare decode step 1B 1.266 -> 1.252 ms, "
                       "270M 0.692 -> 0.692)"),
    "MUSER_CHUNK_GRAPHS": ("off|on", "on", "backends/cuda (graph runner)",
                           "on: one session's chunk of up to 2,048 tokens (a prompt, a later "
                           "turn, a verification block; longer ones: MUSER_CHUNK_GRAPH_ROWS) "
                           "runs as one captured graph per bucket "
                           "of rows -- the same bits as the eager pass, without its host "
                           "overhead (H200, 1B: a 512-token prefill 1.74x, a verification "
                           "block 16.8 -> 6.6 ms); off: eager chunks"),
    "MUSER_CHUNK_GRAPH_ROWS": ("auto|int >= 1", "auto", "backends/cuda (graph runner)",
                               "the largest bucket a captured chunk pass uses: a chunk of up to "
                               "2,048 rows takes its bucket padded, a longer one a graph only when "
                               "its length is a bucket's (3,072 ... 16,384: a long prompt's full "
                               "prefill chunks; other lengths eager) -- the same bits either way; "
                               "each bucket keeps its buffers once captured.  auto: up to the "
                               "prefill chunk where one bucket's buffers take <= 1/64 of the GPU's "
                               "memory (H200, 1B shape: 16,384, ~0.9 GB; against eager long chunks "
                               "the 8k prefill 245-262k -> 268-269k tok/s, 270M 471-549k -> "
                               "711-746k; 16k: 1B 248-251k -> 250k, 270M 590k -> 621k); <= 2,048: "
                               "long chunks eager"),
    "MUSER_GRAPH_KEYS": ("apart|staged", "staged", "backends/cuda (graph runner)",
                         "where a captured chunk pass reads keys: apart = the history in place "
                         "(a ring by its wrapped slots) and the chunk's own rows from a second "
                         "buffer; staged = one ordered view, as the eager pass reads -- a growing "
                         "plane takes the chunk's rows past its end first, a ring's history is "
                         "gathered into an ordered shadow (the same bits; apart compiled to "
                         "scalar loads and 1-3 KB of spills a thread)"),
    "MUSER_PDL": ("off|on", "on", "backends/cuda (decode step)",
                  "on: the decode step's kernels launch as programmatic dependents (sm_90): "
                  "each may launch while the one before finishes, and waits for it on the "
                  "device before anything else -- the same bits, the launch gaps hidden (H200, "
                  "1B at 2k: decode 9% faster, 16 sessions 18%); off: plain launches"),
    "MUSER_PIPELINE": ("off|on", "on", "backends/cuda (greedy runs)",
                       "on: `Engine.decode_greedy` and greedy `engine.stream` / `generate` "
                       "launch step N+1 before they read step N's pick back (cuda/greedy.py: "
                       "the host's share hidden behind the GPU; the same tokens; H200, 270M: "
                       "16 sessions 16.7k -> 20.2k tok/s, one 0.65 -> 0.60 ms/token; with the "
                       "copies on side streams: 270M 23.8k, 1B 12.05k tok/s); off: one "
                       "step at a time (the server's own switch is `--pipeline`)"),
    "MUSER_ATTN_TILES": ("masked|interior", "interior", "backends/cuda (attention)",
                         "interior: key tiles every row sees whole skip the masks (the same "
                         "bits); masked: every tile masked (experiments)"),
    "MUSER_ATTN_ACC": ("dot|add", "dot", "backends/cuda (attention)",
                       "dot: p @ V accumulates onto the rescaled accumulator inside the MMA; "
                       "add: a separate add (part of the arithmetic: experiments)"),
    "MUSER_ATTN_REGS": ("auto|off|168|128", "auto", "backends/cuda (decode attention)",
                        "register cap of the decode-attention launch (register allocation only: "
                        "the same bits); auto = 168 in steps of 8 or more sessions (three programs "
                        "an SM instead of two), none below"),
    "MUSER_PREFETCH": ("auto|off|4|8|16|24|32|48", "auto", "backends/cuda (decode step)",
                       "MB of each layer's o, gate|up and down weights (in that order) that its "
                       "decode-attention launch asks the copy engine to bring into the L2 while "
                       "the memory bus idles (l2_prefetch.py; the same bits); auto = 8 in steps "
                       "of one row, off in batches (H200: 1B -20 us a token, 270M -9 us; 16 rows "
                       "+20 us, more MB slower); a number: every step"),
    "MUSER_ATTN_EARLY": ("off|on", "on", "backends/cuda (decode step)",
                         "on: with PDL, the decode attention reads what the launch before does "
                         "not write (plane table, slot, length, position, rotation, norm "
                         "weights) before its PDL wait, and its idle splits leave without "
                         "waiting -- the same bits (H200: 1B 1.082 -> 1.057 ms a step, 270M "
                         "0.541 -> 0.532, 16 sessions -2%); off: everything after the wait"),
    "MUSER_ATTN_RING": ("block_n,warps or block_nxwarps", "unset",
                        "backends/cuda (decode attention)",
                        "tile of the ring decode-attention kernel (experiments)"),
    "MUSER_ATTN_GROWING": ("block_n,warps or block_nxwarps", "unset",
                           "backends/cuda (decode attention)",
                           "tile of the growing decode-attention kernel (experiments)"),
    "MUSER_TEST_REF_DIR": ("path", "$MUSER_CACHE_DIR/test-reference", "tests/model",
                           "where the tests keep transformers' reference outputs"),
    "MUSER_TEST_REFRESH": ("bool", "0", "tests/model", "1: recompute the cached reference outputs"),
    "MUSER_TRITON_INTERPRET": ("bool", "0", "tests/cuda",
                               "1: run the Triton kernel tests on the CPU under Triton's interpreter"),
}
RENAMED = {"MUSER_CACHE": "MUSER_CACHE_DIR", "MUSER_GROWING_MIN_ROWS": "MUSER_GROWING_ROWS"}
# experiment switches measured slower and removed: set to anything but off (0, false, no) -- or
# the old default's spelling (REMOVED_DEFAULT), which asked for what still runs -- refused (the
# variable would otherwise be ignored while its user believes it runs)
REMOVED = {"MUSER_MEGA": "removed: measured slower, benchmarks/NOTES.md, fourteenth session",
           "MUSER_NORM_IN": "removed: measured slower, benchmarks/NOTES.md, eighteenth session",
           "MUSER_DOT_EARLY": "removed: measured slower (H200, 1B decode +125 us a step), "
                              "benchmarks/NOTES.md, thirty-sixth session",
           "MUSER_ATTN_O": "removed: measured slower (H200, 1B decode +91 us a step, 270M +31 "
                           "us), benchmarks/NOTES.md, thirty-sixth session",
           "MUSER_DOT_AHEAD": "removed: measured slower on the 1B (H100, decode +9 us a step; "
                              "the 270M -6 us, one round), benchmarks/NOTES.md, forty-second "
                              "session",
           "MUSER_ATTN_KV_FIRST": "removed: measured slower (H100, 270M decode +18 us a step, "
                                  "1B +21, 16 sessions +55 us; the same bits), "
                                  "benchmarks/NOTES.md, forty-third session",
           "MUSER_ATTN_PROLOGUE": "removed: measured no faster (H100, 270M / 1B decode -2 us "
                                  "a step, one round: noise; the same bits), "
                                  "benchmarks/NOTES.md, forty-third session",
           "MUSER_PREFETCH_QKV": "removed: measured slower with MUSER_PREFETCH_MLP (H200, 1B "
                                 "decode +36 us a step; alone -2 us, noise), "
                                 "benchmarks/NOTES.md, thirty-fourth / thirty-sixth session",
           "MUSER_PREFETCH_MLP": "removed: measured slower (H200, 1B decode +45 us a step), "
                                 "benchmarks/NOTES.md, thirty-fourth / thirty-sixth session",
           "MUSER_PREFETCH_HINT": "removed: measured slower (H200, 1B decode, 16 MB under "
                                  "evict_last +21 us a step), benchmarks/NOTES.md, "
                                  "thirty-fourth / thirty-sixth session",
           "MUSER_PREFETCH_PROGRAMS": "removed: measured slower (H200, 1B decode, 128 programs "
                                      "instead of 32, both at 32 MB: +28 us a step; 32 stays), "
                                      "benchmarks/NOTES.md, thirty-fourth / thirty-sixth session",
           "MUSER_PREFETCH_AT": "removed: measured slower (H200, early -- the prefetch row "
                                "before the PDL wait: +90 us a 4B step, the same on the 1B / "
                                "270M; wait stays), benchmarks/NOTES.md, thirty-fourth / "
                                "thirty-sixth session"}
# a removed switch's old default, accepted as silently as off: it named what still runs
REMOVED_DEFAULT = {"MUSER_PREFETCH_HINT": "normal", "MUSER_PREFETCH_PROGRAMS": "32",
                   "MUSER_PREFETCH_AT": "wait", "MUSER_ATTN_PROLOGUE": "join"}


def table() -> str:
    """KNOBS as the markdown table docs/env.md carries."""
    rows = ["| variable | type | default | read by | what it does |", "|---|---|---|---|---|"]
    for name, (kind, default, by, what) in KNOBS.items():
        rows.append(f"| `{name}` | {kind} | {default} | {by} | {what} |")
    return "\n".join(rows)
