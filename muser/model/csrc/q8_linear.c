/* Weight-only int8 linear for few rows (CPU decode and verification blocks).
 *
 *   y[m, n] = scale[n] * sum_k (x[m, k] * in_scale[k]) * w[n, k]        (f32 accumulation)
 *
 * Why it exists: at M = 1..16 a decode step streams every weight once, so the
 * kernel must run at memory speed.  aten::_weight_int8pack_mm reaches ~11 GB/s
 * on the 2-core Zen 4 box (59 GB/s DRAM): benchmarks/NOTES.md, "Native int8 GEMV".
 *
 * Exactness contract (what the engine's bitwise replay/rollback rely on):
 *   - row invariance: row m of an M-row call is bitwise the M = 1 call.  Every
 *     (m, n) accumulates k in the same order into the same 16 lanes and reduces
 *     them the same way, whatever M is and however rows are grouped;
 *   - thread invariance: the output rows n are split between threads, never k,
 *     so the thread count changes who computes a value, not how.
 *
 * Build: muser/model/native.py compiles this with -O3 -march=native -fopenmp and
 * loads it after torch, so `#pragma omp` uses torch's own OpenMP pool.
 */
#include <stdint.h>
#include <stdlib.h>

#include "common.h"
#ifdef __AVX512F__
#include <immintrin.h>
#endif

#define NB 4   /* output rows per block: 4 weight streams in flight per thread */
#define MB 4   /* activation rows per pass: 4 x 4 accumulators + 4 weights fit the 32 zmm */

#ifdef __AVX512F__
static inline __m512 wload(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

/* rows [n0, n0 + nb) x activation rows [m0, m0 + mb); K % 16 == 0. */
static void block(const float *xs, int64_t m0, int mb, int64_t K, const int8_t *w, int64_t n0, int nb,
                  const float *scale, void *y, int y_bf16, int64_t N) {
    __m512 acc[MB][NB];
    for (int i = 0; i < MB; i++)
        for (int j = 0; j < NB; j++) acc[i][j] = _mm512_setzero_ps();
    const int8_t *wr[NB];
    for (int j = 0; j < NB; j++) wr[j] = w + (n0 + (j < nb ? j : 0)) * K;
    /* The NB rows of a block are one contiguous run of NB * K bytes.  While this block
     * streams, fetch the next block's run, one cache line per step (NB * 16 bytes are
     * consumed per step, so the whole run is requested by the end of this block).
     * Without it the hardware prefetcher leaves the kernel at ~half the bandwidth
     * (NOTES.md, "Native int8 GEMV": 22 -> 43 GB/s for the LM head). */
    const char *ahead = (const char *)(w + (n0 + NB) * K);
    const char *end = (const char *)(w + N * K);
    for (int64_t k = 0; k < K; k += 16) {
        const char *pf = ahead + k * NB;
        for (int l = 0; l < NB / 4; l++)
            if (pf + 64 * l < end) _mm_prefetch(pf + 64 * l, _MM_HINT_T0);
        __m512 wv[NB];
        for (int j = 0; j < NB; j++) wv[j] = wload(wr[j] + k);
        for (int i = 0; i < mb; i++) {
            __m512 xv = _mm512_loadu_ps(xs + (m0 + i) * K + k);
            for (int j = 0; j < NB; j++) acc[i][j] = _mm512_fmadd_ps(wv[j], xv, acc[i][j]);
        }
    }
    for (int i = 0; i < mb; i++)
        for (int j = 0; j < nb; j++)
            st(y, y_bf16, (m0 + i) * N + n0 + j, _mm512_reduce_add_ps(acc[i][j]) * scale[n0 + j]);
}
#endif

/* The portable path (no AVX-512 or K % 16 != 0): the same 16-lane order, scalar. */
static void block_generic(const float *xs, int64_t m0, int mb, int64_t K, const int8_t *w, int64_t n0,
                          int nb, const float *scale, void *y, int y_bf16, int64_t N) {
    for (int i = 0; i < mb; i++) {
        const float *xr = xs + (m0 + i) * K;
        for (int j = 0; j < nb; j++) {
            const int8_t *wr = w + (n0 + j) * K;
            float lane[16] = {0};
            for (int64_t k = 0; k < K; k++) lane[k & 15] += (float)wr[k] * xr[k];
            float s = 0.0f;
            for (int l = 0; l < 16; l++) s += lane[l];
            st(y, y_bf16, (m0 + i) * N + n0 + j, s * scale[n0 + j]);
        }
    }
}

/* x [M, K] (f32, or bf16 when x_bf16), w [N, K] int8, scale [N] f32, in_scale [K] f32 or NULL,
 * y [M, N] (f32, or bf16 when y_bf16).  Returns 0, or -1 when scratch cannot be allocated. */
int muser_q8_linear(const void *x, int x_bf16, int64_t M, int64_t K, const int8_t *w, const float *scale,
                    const float *in_scale, int64_t N, void *y, int y_bf16, int nthreads) {
    float *xs = (float *)aligned_alloc(64, (size_t)((M * K * 4 + 63) / 64 * 64));
    if (!xs) return -1;
    for (int64_t i = 0; i < M * K; i++) {
        float v = ld(x, x_bf16, i);
        xs[i] = in_scale ? v * in_scale[i % K] : v;
    }
    int64_t blocks = (N + NB - 1) / NB;
    int fast = 0;
#ifdef __AVX512F__
    fast = (K % 16 == 0);
#endif
    #pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t b = 0; b < blocks; b++) {
        int64_t n0 = b * NB;
        int nb = (int)(N - n0 < NB ? N - n0 : NB);
        for (int64_t m0 = 0; m0 < M; m0 += MB) {
            int mb = (int)(M - m0 < MB ? M - m0 : MB);
#ifdef __AVX512F__
            if (fast) { block(xs, m0, mb, K, w, n0, nb, scale, y, y_bf16, N); continue; }
#endif
            block_generic(xs, m0, mb, K, w, n0, nb, scale, y, y_bf16, N);
        }
    }
    free(xs);
    return 0;
}
