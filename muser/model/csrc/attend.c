/* Grouped-query attention where every key is visible (a CPU decode step).
 *
 *   for each query row t, head h (KV group g = h / (H / KV)):
 *       s[j]  = scale * <q[t, h], k[j, g]>          softcap: s = cap * tanh(s / cap)
 *       out[t, h] = sum_j softmax(s)[j] v[j, g]                              (f32 throughout)
 *
 * Keys/values are read where they live: k[j, g, :] is at k + j * stride_s + g * stride_kv
 * (a token-major ring: stride_s = KV * D, stride_kv = D; a head-major growing plane:
 * stride_s = D, stride_kv = allocated * D), the head dim contiguous.  In eager torch
 * this was ~15 ops per layer (casts, permutes, two matmuls, softmax).
 *
 * Work split (flash-decoding): keys are cut into fixed CHUNK-row pieces; a task is
 * (t, g, piece) and serves every head of the group, so a key row is converted
 * once for G heads.  A task leaves (max, sum of exp, unnormalized output) per
 * head; the pieces are then merged in piece order:
 *
 *     keys  [0 ........ 255][256 ...... 511][512 .. 700]     S = 701, CHUNK = 256
 *     task       piece 0         piece 1       piece 2       (any thread)
 *     merge  M = max m_c;  out = sum_c e^(m_c - M) o_c / sum_c e^(m_c - M) l_c
 *
 * Pieces depend on S only, never on the thread count, and every (t, h) does the
 * same operations whatever else is in the call: bitwise row- and thread-invariant.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#ifdef __AVX512F__
#include <immintrin.h>
#endif

#define CHUNK 256
#define GMAX 16       /* heads per KV group */
#define DMAX 1024

#ifdef __AVX512F__
static inline __m512 vld(const void *p, int bf16, int64_t i) {   /* 16 values as f32 */
    if (!bf16) return _mm512_loadu_ps((const float *)p + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
#endif

/* One piece: rows [j0, j1) of group g for the G query heads qf [G][D] (f32, pre-scaled by 1).
 * Leaves m[G], l[G], o[G][D]. */
static void piece(const float *qf, int G, int64_t D, const void *k, const void *v, int bf16,
                  int64_t j0, int64_t j1, int64_t stride_s, int64_t off, float scale, float softcap,
                  float *m, float *l, float *o) {
    int64_t n = j1 - j0;
    float s[GMAX][CHUNK];
    for (int64_t j = 0; j < n; j++) {
        int64_t base = (j0 + j) * stride_s + off;
        float dot[GMAX];
#ifdef __AVX512F__
        __m512 acc[GMAX];
        for (int hh = 0; hh < G; hh++) acc[hh] = _mm512_setzero_ps();
        for (int64_t d = 0; d < D; d += 16) {
            __m512 kv = vld(k, bf16, base + d);
            for (int hh = 0; hh < G; hh++) acc[hh] = _mm512_fmadd_ps(_mm512_loadu_ps(qf + hh * D + d), kv, acc[hh]);
        }
        for (int hh = 0; hh < G; hh++) dot[hh] = _mm512_reduce_add_ps(acc[hh]);
#else
        for (int hh = 0; hh < G; hh++) {
            float lane[16] = {0};
            for (int64_t d = 0; d < D; d += 16)
                for (int x = 0; x < 16; x++) lane[x] += qf[hh * D + d + x] * ld(k, bf16, base + d + x);
            float t = 0.0f;
            for (int x = 0; x < 16; x++) t += lane[x];
            dot[hh] = t;
        }
#endif
        for (int hh = 0; hh < G; hh++) {
            float x = dot[hh] * scale;
            s[hh][j] = softcap > 0.0f ? softcap * tanhf(x / softcap) : x;
        }
    }
    for (int hh = 0; hh < G; hh++) {
        float mx = -INFINITY, sum = 0.0f;
        for (int64_t j = 0; j < n; j++) mx = s[hh][j] > mx ? s[hh][j] : mx;
        for (int64_t j = 0; j < n; j++) { s[hh][j] = expf(s[hh][j] - mx); sum += s[hh][j]; }
        m[hh] = mx;
        l[hh] = sum;
    }
    for (int64_t d = 0; d < D; d += 16) {
#ifdef __AVX512F__
        __m512 acc[GMAX];
        for (int hh = 0; hh < G; hh++) acc[hh] = _mm512_setzero_ps();
        for (int64_t j = 0; j < n; j++) {
            __m512 vv = vld(v, bf16, (j0 + j) * stride_s + off + d);
            for (int hh = 0; hh < G; hh++) acc[hh] = _mm512_fmadd_ps(_mm512_set1_ps(s[hh][j]), vv, acc[hh]);
        }
        for (int hh = 0; hh < G; hh++) _mm512_storeu_ps(o + hh * D + d, acc[hh]);
#else
        for (int hh = 0; hh < G; hh++) {
            float acc[16] = {0};
            for (int64_t j = 0; j < n; j++)
                for (int x = 0; x < 16; x++) acc[x] += s[hh][j] * ld(v, bf16, (j0 + j) * stride_s + off + d + x);
            memcpy(o + hh * D + d, acc, sizeof acc);
        }
#endif
    }
}

/* D % 16 == 0, D <= 1024, H / KV <= 16.  Returns 0, -1 (bad shape) or -2 (no memory). */
int muser_attend_visible(const void *q, int q_bf16, int64_t T, int64_t H, int64_t D,
                         const void *k, const void *v, int kv_bf16, int64_t S, int64_t KV,
                         int64_t stride_s, int64_t stride_kv, float scale, float softcap,
                         void *out, int out_bf16, int nthreads) {
    if (D % 16 || D > DMAX || H % KV || H / KV > GMAX || S < 1) return -1;
    int G = (int)(H / KV);
    int64_t pieces = (S + CHUNK - 1) / CHUNK, tasks = T * KV * pieces;
    /* per task: m[G], l[G], o[G][D] */
    int64_t per = (int64_t)G * (D + 2);
    float *scratch = (float *)malloc((size_t)(tasks * per) * sizeof(float));
    if (!scratch) return -2;
    #pragma omp parallel for schedule(static) num_threads(tasks > 1 ? nthreads : 1)
    for (int64_t task = 0; task < tasks; task++) {
        int64_t c = task % pieces, tg = task / pieces, t = tg / KV, g = tg % KV;
        float qf[GMAX * DMAX];
        for (int hh = 0; hh < G; hh++)
            for (int64_t d = 0; d < D; d++) qf[hh * D + d] = ld(q, q_bf16, (t * H + g * G + hh) * D + d);
        float *m = scratch + task * per, *l = m + G, *o = l + G;
        int64_t j0 = c * CHUNK, j1 = j0 + CHUNK < S ? j0 + CHUNK : S;
        piece(qf, G, D, k, v, kv_bf16, j0, j1, stride_s, g * stride_kv, scale, softcap, m, l, o);
    }
    #pragma omp parallel for schedule(static) num_threads(T * H > 1 ? nthreads : 1)
    for (int64_t r = 0; r < T * H; r++) {                  /* merge the pieces in order */
        int64_t t = r / H, h = r % H, g = h / G, hh = h % G;
        float *first = scratch + (t * KV + g) * pieces * per;
        float M = -INFINITY, L = 0.0f, acc[DMAX];
        for (int64_t c = 0; c < pieces; c++) M = first[c * per + hh] > M ? first[c * per + hh] : M;
        for (int64_t d = 0; d < D; d++) acc[d] = 0.0f;
        for (int64_t c = 0; c < pieces; c++) {
            const float *m = first + c * per, *o = m + 2 * G + hh * D;
            float w = expf(m[hh] - M);
            L += w * m[G + hh];
            for (int64_t d = 0; d < D; d++) acc[d] += w * o[d];
        }
        for (int64_t d = 0; d < D; d++) st(out, out_bf16, (t * H + h) * D + d, acc[d] / L);
    }
    free(scratch);
    return 0;
}
