/* Grouped-query attention for query rows at absolute positions (CPU): one arithmetic per row.
 *
 *   query row t at position p = qpos[t], head h (KV group g = h / G, G = H / KV) sees the keys
 *   at positions [lo, p], lo = max(0, p - W + 1) (W = 0: unbounded, lo = 0).  Key position j
 *   lives in row (rot + j - pos0) mod cap of k / v: k + row * stride_s + g * stride_kv, the head
 *   dim contiguous.  That one formula reads a ring in place (pos0 = origin_logical, rot =
 *   origin_physical, cap = capacity), a growing plane or a staged shadow (rot = 0).
 *
 * The arithmetic of a row depends on (q row, p, W, the keys) alone -- never on how many rows
 * share the call, which rows they are, where the chunk starts, or the thread count:
 *   pieces   keys are cut at multiples of PIECE in ABSOLUTE position:
 *                keys    [lo ....... 255][256 ...... 511][512 .. p]
 *                piece c        0               1            2
 *   score    s_j = dot(q, k_j) * scale (softcap: cap * tanh(s / cap)); dot = 16 lanes, lane i
 *            accumulating d = i, i + 16, ... by fma in d order, then tree16 (below)
 *   piece    m_c = max s_j;  e_j = exp(s_j - m_c) (exp_ps, below);
 *            l_c = tree16 of 16 lanes, lane i summing e_j for j = i mod 16 in j order;
 *            o_c[d] = sum_j e_j v_j[d], fma in j order from 0
 *   merge    M = max_c m_c;  w_c = exp(m_c - M);  L = sum_c w_c l_c;  out = (sum_c w_c o_c) / L
 *            (products then sums, c ascending).  With attention sinks (gpt-oss: a learned logit
 *            s_h per head joining the denominator) M = max(M, s_h) and L += exp(s_h - M) last.
 * so a decode step, a verification row, a row of any prefill chunk and a batched row compute
 * the same bits for the same token (issue 12).
 *
 * Work: rows are taken in blocks of R = 16 / G (4 rows x 4 heads for Gemma 3 270M), so 16
 * (row, head) dot products share each key row loaded, and one transposing reduction finishes
 * 16 dots at once; the same tree16 as a lone dot.  A decode row (1 x 4 heads) takes 4 keys per
 * reduction instead.  Tasks: (row block, group) with their pieces in order when there are
 * enough blocks; otherwise (row block, group, piece), flash-decoding style, then the merge.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#define PIECE 256
#define SC_RG 8       /* query vectors per score tile of 16 (x 2 keys): each q load feeds 2 fmas;
                         16 x 1 measured 20% slower (benchmarks/NOTES.md) */
#define GMAX 16       /* heads per KV group */
#define DMAX 1024

typedef struct {
    const void *q; int q_bf16; int64_t T, H, D, KV, G;
    const int64_t *qpos; int64_t qpos0, window;   /* row t at qpos[t], or qpos0 + t when qpos is NULL */
    const void *k, *v; int kv_bf16; int64_t pos0, S, rot, cap, stride_s, stride_kv;
    float scale, softcap;
    void *out; int out_bf16;
    int64_t R;           /* rows per block */
    const float *sinks;  /* [H] softmax sinks, or NULL */
} Args;

/* ------------------------------------------------------------------ element-wise maths */
/* exp for x <= 0 (Cephes expf): the same operations in the scalar and the vector form. */
static inline float exp_s(float x) {
    if (x != x) return x;
    x = x < -87.0f ? -87.0f : x;
    float n = rintf(x * 1.44269504088896341f);
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float rr = r * r;
    float y = p * rr;
    y = y + r;
    y = y + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float two;
    memcpy(&two, &bits, 4);
    return y * two;
}

/* lanes[0..16) -> ((l0+l8)+(l4+l12)) + ((l2+l10)+(l6+l14)) + ((l1+l9)+(l5+l13)) + ((l3+l11)+(l7+l15)) */
static inline float tree16(const float *l) {
    float u[8], w[4], x[2];
    for (int i = 0; i < 8; i++) u[i] = l[i] + l[i + 8];
    for (int i = 0; i < 4; i++) w[i] = u[i] + u[i + 4];
    for (int i = 0; i < 2; i++) x[i] = w[i] + w[i + 2];
    return x[0] + x[1];
}

static inline float score_post(float dot, float scale, float softcap) {
    float s = dot * scale;
    return softcap > 0.0f ? softcap * tanhf(s / softcap) : s;
}

#ifdef __AVX512F__
static inline __attribute__((always_inline)) __m512 vld(const void *p, int bf16, int64_t i) {   /* 16 values as f32 */
    if (!bf16) return _mm512_loadu_ps((const float *)p + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

static inline __m512 exp_ps(__m512 x) {       /* exp_s on 16 lanes, bit for bit */
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    __m512 xc = _mm512_max_ps(_mm512_set1_ps(-87.0f), x);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_sub_ps(xc, _mm512_mul_ps(n, _mm512_set1_ps(0.693359375f)));
    r = _mm512_sub_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(-2.12194440e-4f)));
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(5.0000001201e-1f));
    __m512 y = _mm512_mul_ps(p, _mm512_mul_ps(r, r));
    y = _mm512_add_ps(_mm512_add_ps(y, r), _mm512_set1_ps(1.0f));
    __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    y = _mm512_mul_ps(y, _mm512_castsi512_ps(bits));
    return _mm512_mask_mov_ps(y, nan, x);
}

/* 16 vectors -> one vector of their tree16 sums, in natural order (lane i = tree16(v[i])). */
static inline __attribute__((always_inline)) __m512 reduce16(__m512 *v) {
    __m512 u[8], w[4], x[2];
    for (int a = 0; a < 8; a++)      /* lanes i, i + 8 */
        u[a] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * a], v[2 * a + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * a], v[2 * a + 1], 0xEE));
    for (int b = 0; b < 4; b++)      /* lanes i, i + 4 */
        w[b] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * b], u[2 * b + 1], 0x88),
                             _mm512_shuffle_f32x4(u[2 * b], u[2 * b + 1], 0xDD));
    for (int c = 0; c < 2; c++)      /* lanes i, i + 2 */
        x[c] = _mm512_add_ps(_mm512_shuffle_ps(w[2 * c], w[2 * c + 1], 0x44),
                             _mm512_shuffle_ps(w[2 * c], w[2 * c + 1], 0xEE));
    __m512 y = _mm512_add_ps(_mm512_shuffle_ps(x[0], x[1], 0x88), _mm512_shuffle_ps(x[0], x[1], 0xDD));
    /* y lane 4L + i holds vector 4i + L */
    const __m512i idx = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    return _mm512_permutexvar_ps(idx, y);
}
#endif

/* ------------------------------------------------------------------ addressing */
static inline int64_t qp(const Args *a, int64_t t) {
    return a->qpos ? a->qpos[t] : a->qpos0 + t;
}

static inline int64_t lo_of(const Args *a, int64_t p) {
    return a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
}

static inline int64_t key_off(const Args *a, int64_t j, int64_t g) {
    int64_t r = a->rot + (j - a->pos0);
    if (r >= a->cap) r -= a->cap;
    return r * a->stride_s + g * a->stride_kv;
}

/* ------------------------------------------------------------------ one piece of one block */
/* A piece's work for a block: the keys [A, B) (the union of its rows' ranges) and, per (row,
 * head) vector rg < nrg, its own range [klo, khi).  Scores are kept key-major,
 * St[(j - c0) * NP2 + rg] (NP2 = nrg rounded up to a power of two), so one reduction's 16 dots
 * (KB = 16 / NP2 keys x NP2 vectors) are one contiguous vector. */
typedef struct {
    int64_t c0, A, B, klo[16], khi[16];
    int nrg, np2;
    int64_t off[PIECE];                 /* element offset of key j's row (group g): off[j - A] */
} Piece;

/* Slot of (rg, piece index pc) in a block's scratch: m, l, o[D]. */
static inline float *slot(float *base, int64_t rg, int64_t pc, int64_t NP, int64_t D) {
    return base + (rg * NP + pc) * (D + 2);
}

static inline int active(const Piece *pc, int i, int64_t j) {
    return i < pc->nrg && j >= pc->klo[i] && j < pc->khi[i];
}

#ifdef __AVX512F__
/* RG query vectors x KB = 16 / RG keys per reduction; NP2 / RG groups of vectors per key step. */
static inline __attribute__((always_inline)) void scores_n(const Args *a, const Piece *pc, const float *qf,
                                                           const int NP2, const int RG, float *St) {
    const int KB = 16 / RG;
    int64_t D = a->D, A = pc->A, B = pc->B;
    __m512 vscale = _mm512_set1_ps(a->scale);
    for (int64_t j = A; j < B; j += KB) {
        const char *kp[16];
        for (int kk = 0; kk < KB; kk++)
            kp[kk] = (const char *)a->k + pc->off[(j + kk < B ? j + kk : B - 1) - A] * (a->kv_bf16 ? 2 : 4);
        for (int rg0 = 0; rg0 < NP2; rg0 += RG) {
            __m512 acc[16];
            for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
#define SCORE_LOOP(BF16)                                                                       \
            for (int64_t d = 0; d < D; d += 16) {                                              \
                const float *qd = qf + d * NP2 + 16 * rg0;                                     \
                __m512 kv[16];                                                                 \
                for (int kk = 0; kk < KB; kk++) kv[kk] = vld(kp[kk], BF16, d);                 \
                for (int i = 0; i < RG; i++) {                                                 \
                    __m512 qv = _mm512_loadu_ps(qd + 16 * i);                                  \
                    __asm__("" : "+v"(qv));        /* one load, used by KB fmas */             \
                    for (int kk = 0; kk < KB; kk++)                                            \
                        acc[kk * RG + i] = _mm512_fmadd_ps(qv, kv[kk], acc[kk * RG + i]);      \
                }                                                                              \
            }
            if (a->kv_bf16) { SCORE_LOOP(1) } else { SCORE_LOOP(0) }
#undef SCORE_LOOP
            float r[16];
            _mm512_storeu_ps(r, _mm512_mul_ps(reduce16(acc), vscale));
            for (int kk = 0; kk < KB; kk++) {
                float *dst = St + (j + kk - pc->c0) * NP2 + rg0;
                for (int i = 0; i < RG; i++)
                    dst[i] = a->softcap > 0.0f ? a->softcap * tanhf(r[kk * RG + i] / a->softcap) : r[kk * RG + i];
            }
        }
    }
}

/* Per-element mask of the flat score chunk starting at key j (lane l = (kk, i)). */
static inline __mmask16 chunk_mask(const Piece *pc, const int NP2, int64_t j) {
    __mmask16 mk = 0;
    for (int l = 0; l < 16; l++)
        if (active(pc, l % NP2, j + l / NP2)) mk |= (__mmask16)(1u << l);
    return mk;
}

/* m, l per rg and St = exp(St - m) over the active elements; lanes of l by j mod 16. */
static inline __attribute__((always_inline)) void softmax_n(const Piece *pc, const int NP2, float *St,
                                                            float *m, float *l) {
    const int KB = 16 / NP2;
    int64_t all_lo = pc->A, all_hi = pc->B;
    for (int i = 0; i < pc->nrg; i++) {
        all_lo = pc->klo[i] > all_lo ? pc->klo[i] : all_lo;
        all_hi = pc->khi[i] < all_hi ? pc->khi[i] : all_hi;
    }
    __mmask16 full = 0;
    for (int ll = 0; ll < 16; ll++)
        if (ll % NP2 < pc->nrg) full |= (__mmask16)(1u << ll);
    int64_t j0 = pc->A - (pc->A - pc->c0) % 16;          /* chunks start at multiples of 16 keys */
    __m512 vm = _mm512_set1_ps(-INFINITY);
    for (int64_t j = j0; j < pc->B; j += KB) {
        __mmask16 mk = (j >= all_lo && j + KB <= all_hi) ? full : chunk_mask(pc, NP2, j);
        vm = _mm512_mask_max_ps(vm, mk, vm, _mm512_maskz_loadu_ps(mk, St + (j - pc->c0) * NP2));
    }
    float lanes[16];
    _mm512_storeu_ps(lanes, vm);
    for (int i = 0; i < NP2; i++) {                       /* max: exact in any order */
        float mx = -INFINITY;
        for (int kk = 0; kk < KB; kk++) mx = lanes[kk * NP2 + i] > mx ? lanes[kk * NP2 + i] : mx;
        m[i] = mx;
    }
    for (int ll = 0; ll < 16; ll++) lanes[ll] = m[ll % NP2];
    __m512 vmx = _mm512_loadu_ps(lanes);
    __m512 L[16];                                         /* L[t] element f: key j = t mod 16 (flat) */
    for (int t = 0; t < NP2; t++) L[t] = _mm512_setzero_ps();
    for (int64_t j = j0; j < pc->B; j += KB) {
        __mmask16 mk = (j >= all_lo && j + KB <= all_hi) ? full : chunk_mask(pc, NP2, j);
        float *src = St + (j - pc->c0) * NP2;
        __m512 e = exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, src), vmx));
        _mm512_mask_storeu_ps(src, mk, e);
        int t = (int)(((j - pc->c0) / KB) % NP2);
        L[t] = _mm512_mask_add_ps(L[t], mk, L[t], e);
    }
    float flat[16 * 16];
    for (int t = 0; t < NP2; t++) _mm512_storeu_ps(flat + 16 * t, L[t]);
    for (int i = 0; i < pc->nrg; i++) {
        float ln[16];
        for (int t = 0; t < 16; t++) ln[t] = flat[t * NP2 + i];
        l[i] = tree16(ln);
    }
}

/* o[rg] += E[j][rg] v_j (j ascending) for tiles of NP2 / RGS vectors x DC d-chunks. */
#define PV_RANGE(BF16, MASKED)                                                                 \
    for (int64_t j = j0; j < j1; j++) {                                                        \
        const char *vr = vb + pc->off[j - pc->A] * esz;                                        \
        __m512 vv[16];                                                                         \
        for (int c = 0; c < DC; c++) vv[c] = vld(vr, BF16, d + 16 * c);                        \
        const float *e = St + (j - pc->c0) * NP2 + rg0;                                        \
        for (int i = 0; i < RG; i++)                                                           \
            if (!(MASKED) || active(pc, rg0 + i, j)) {                                         \
                __m512 ev = _mm512_set1_ps(e[i]);                                              \
                for (int c = 0; c < DC; c++) acc[i * DC + c] = _mm512_fmadd_ps(ev, vv[c], acc[i * DC + c]); \
            }                                                                                  \
    }

static inline __attribute__((always_inline)) void pv_n(const Args *a, const Piece *pc, const int NP2, const int RG,
                                                       const int DC, const float *St, float **o) {
    int64_t D = a->D;
    int esz = a->kv_bf16 ? 2 : 4;
    const char *vb = (const char *)a->v;
    int64_t all_lo = pc->A, all_hi = pc->B;
    for (int i = 0; i < pc->nrg; i++) {
        all_lo = pc->klo[i] > all_lo ? pc->klo[i] : all_lo;
        all_hi = pc->khi[i] < all_hi ? pc->khi[i] : all_hi;
    }
    if (all_hi < all_lo) all_hi = all_lo;
    for (int rg0 = 0; rg0 < NP2 && rg0 < pc->nrg; rg0 += RG)
        for (int64_t d = 0; d < D; d += 16 * DC) {
            __m512 acc[16];
            for (int i = 0; i < RG * DC; i++) acc[i] = _mm512_setzero_ps();
            int64_t j0 = pc->A, j1 = all_lo;
            if (a->kv_bf16) { PV_RANGE(1, 1) } else { PV_RANGE(0, 1) }
            j0 = all_lo; j1 = all_hi;
            if (a->kv_bf16) { PV_RANGE(1, 0) } else { PV_RANGE(0, 0) }
            j0 = all_hi; j1 = pc->B;
            if (a->kv_bf16) { PV_RANGE(1, 1) } else { PV_RANGE(0, 1) }
            for (int i = 0; i < RG && rg0 + i < pc->nrg; i++)
                for (int c = 0; c < DC; c++) _mm512_storeu_ps(o[rg0 + i] + d + 16 * c, acc[i * DC + c]);
        }
}
#undef PV_RANGE

static void piece_vector(const Args *a, const Piece *pc, const float *qf, float *St, float *m, float *l, float **o) {
    int64_t dch = a->D / 16;
    switch (pc->np2) {
    case 16:
        scores_n(a, pc, qf, 16, SC_RG, St); softmax_n(pc, 16, St, m, l);
        if (dch % 2 == 0) pv_n(a, pc, 16, 8, 2, St, o); else pv_n(a, pc, 16, 16, 1, St, o);
        break;
    case 8:
        scores_n(a, pc, qf, 8, 8, St); softmax_n(pc, 8, St, m, l);
        if (dch % 2 == 0) pv_n(a, pc, 8, 8, 2, St, o); else pv_n(a, pc, 8, 8, 1, St, o);
        break;
    case 4:
        scores_n(a, pc, qf, 4, 4, St); softmax_n(pc, 4, St, m, l);
        if (dch % 4 == 0) pv_n(a, pc, 4, 4, 4, St, o); else pv_n(a, pc, 4, 4, 1, St, o);
        break;
    case 2:
        scores_n(a, pc, qf, 2, 2, St); softmax_n(pc, 2, St, m, l);
        pv_n(a, pc, 2, 2, 1, St, o);
        break;
    default:
        scores_n(a, pc, qf, 1, 1, St); softmax_n(pc, 1, St, m, l);
        pv_n(a, pc, 1, 1, 1, St, o);
        break;
    }
}
#endif

/* The same maths element by element (no AVX-512): same dots (16 fma lanes + tree16), same
 * exp_s, same lanes for l, same j order for o. */
static void piece_scalar(const Args *a, const Piece *pc, const float *qf, float *St, float *m, float *l, float **o) {
    /* written so that a compiler vectorizes the 16-lane and the d loops (AVX2 builds) */
    int64_t D = a->D, NP2 = pc->np2;
    float row[DMAX];
    for (int64_t j = pc->A; j < pc->B; j++) {
        const char *kr = (const char *)a->k + pc->off[j - pc->A] * (a->kv_bf16 ? 2 : 4);
        for (int64_t d = 0; d < D; d++) row[d] = ld(kr, a->kv_bf16, d);
        for (int i = 0; i < NP2; i++) {
            float lane[16] = {0};
#if defined(__AVX2__) && defined(__FMA__)
            __m256 l0 = _mm256_setzero_ps(), l1 = _mm256_setzero_ps();   /* lanes 0-7, 8-15 */
            for (int64_t d0 = 0; d0 < D; d0 += 16) {
                const float *qv = qf + (d0 / 16 * NP2 + i) * 16;
                l0 = _mm256_fmadd_ps(_mm256_loadu_ps(qv), _mm256_loadu_ps(row + d0), l0);
                l1 = _mm256_fmadd_ps(_mm256_loadu_ps(qv + 8), _mm256_loadu_ps(row + d0 + 8), l1);
            }
            _mm256_storeu_ps(lane, l0);
            _mm256_storeu_ps(lane + 8, l1);
#else
            for (int64_t d0 = 0; d0 < D; d0 += 16) {
                const float *qv = qf + (d0 / 16 * NP2 + i) * 16;
                for (int t = 0; t < 16; t++) lane[t] = fmaf(qv[t], row[d0 + t], lane[t]);
            }
#endif
            St[(j - pc->c0) * NP2 + i] = score_post(tree16(lane), a->scale, a->softcap);
        }
    }
    for (int i = 0; i < pc->nrg; i++) {
        float mx = -INFINITY, lanes[16] = {0};
        for (int64_t j = pc->klo[i]; j < pc->khi[i]; j++) {
            float s = St[(j - pc->c0) * NP2 + i];
            mx = s > mx ? s : mx;
        }
        for (int64_t j = pc->klo[i]; j < pc->khi[i]; j++) {
            float *s = &St[(j - pc->c0) * NP2 + i];
            *s = exp_s(*s - mx);
            lanes[(j - pc->c0) & 15] += *s;
        }
        m[i] = mx;
        l[i] = tree16(lanes);
        for (int64_t d = 0; d < D; d++) o[i][d] = 0.0f;
    }
    for (int64_t j = pc->A; j < pc->B; j++) {          /* o: j ascending for every (i, d) */
        const char *vr = (const char *)a->v + pc->off[j - pc->A] * (a->kv_bf16 ? 2 : 4);
        for (int64_t d = 0; d < D; d++) row[d] = ld(vr, a->kv_bf16, d);
        for (int i = 0; i < pc->nrg; i++) {
            if (!active(pc, i, j)) continue;
            float e = St[(j - pc->c0) * NP2 + i], *oi = o[i];
            for (int64_t d = 0; d < D; d++) oi[d] = fmaf(e, row[d], oi[d]);
        }
    }
}

/* Rows [t0, t0 + nr) of group g, piece c: partials into slots (rg, c - cb0) of `base`. */
static void block_piece(const Args *a, int64_t t0, int nr, int64_t g, int64_t c, const float *qf,
                        float *base, int64_t cb0, int64_t NP) {
    int64_t G = a->G, D = a->D;
    Piece pc;
    pc.c0 = c * PIECE;
    pc.nrg = (int)(nr * G);
    pc.np2 = 1;
    while (pc.np2 < pc.nrg) pc.np2 *= 2;
    pc.A = INT64_MAX;
    pc.B = INT64_MIN;
    for (int r = 0; r < nr; r++) {
        int64_t p = qp(a, t0 + r), lo = lo_of(a, p);
        int64_t x0 = lo > pc.c0 ? lo : pc.c0, x1 = p + 1 < pc.c0 + PIECE ? p + 1 : pc.c0 + PIECE;
        if (x0 >= x1) x0 = x1 = pc.c0;                  /* this row does not see this piece */
        for (int hh = 0; hh < G; hh++) {
            pc.klo[r * G + hh] = x0;
            pc.khi[r * G + hh] = x1;
        }
        if (x0 < x1) {
            pc.A = x0 < pc.A ? x0 : pc.A;
            pc.B = x1 > pc.B ? x1 : pc.B;
        }
    }
    if (pc.A >= pc.B) return;
    for (int i = 0; i < pc.nrg; i++)                    /* empty ranges inside [A, B) */
        if (pc.klo[i] == pc.khi[i]) pc.klo[i] = pc.khi[i] = pc.A;
    for (int64_t j = pc.A; j < pc.B; j++) pc.off[j - pc.A] = key_off(a, j, g);
    float St[(PIECE + 16) * 16], m[16], l[16], *o[16];
    for (int i = 0; i < pc.nrg; i++) o[i] = slot(base, i, c - cb0, NP, D) + 2;
#ifdef __AVX512F__
    piece_vector(a, &pc, qf, St, m, l, o);
#else
    piece_scalar(a, &pc, qf, St, m, l, o);
#endif
    for (int i = 0; i < pc.nrg; i++)
        if (pc.klo[i] < pc.khi[i]) {
            float *sl = slot(base, i, c - cb0, NP, D);
            sl[0] = m[i];
            sl[1] = l[i];
        }
}

/* The pieces row p sees: [c_lo, c_hi]. */
static inline void pieces_of(const Args *a, int64_t p, int64_t *c_lo, int64_t *c_hi) {
    *c_lo = lo_of(a, p) / PIECE;
    *c_hi = p / PIECE;
}

/* Merge the pieces of row t0 + r (head hh of group g) from the block scratch into out. */
static void merge(const Args *a, int64_t t0, int r, int64_t g, float *base, int64_t cb0, int64_t NP) {
    int64_t G = a->G, D = a->D, t = t0 + r, c_lo, c_hi;
    pieces_of(a, qp(a, t), &c_lo, &c_hi);
    for (int64_t hh = 0; hh < G; hh++) {
        int64_t rg = r * G + hh;
        float M = -INFINITY, L = 0.0f, acc[DMAX];
        for (int64_t c = c_lo; c <= c_hi; c++) {
            float mc = slot(base, rg, c - cb0, NP, D)[0];
            M = mc > M ? mc : M;
        }
        float sink = a->sinks ? a->sinks[g * G + hh] : 0.0f;
        if (a->sinks && sink > M) M = sink;
        for (int64_t d = 0; d < D; d++) acc[d] = 0.0f;
        for (int64_t c = c_lo; c <= c_hi; c++) {
            const float *sl = slot(base, rg, c - cb0, NP, D);
            float w = exp_s(sl[0] - M);
            float wl = w * sl[1];
            L = L + wl;
            const float *oc = sl + 2;
#ifdef __AVX512F__
            __m512 vw = _mm512_set1_ps(w);
            for (int64_t d = 0; d < D; d += 16)
                _mm512_storeu_ps(acc + d, _mm512_add_ps(_mm512_loadu_ps(acc + d), _mm512_mul_ps(vw, _mm512_loadu_ps(oc + d))));
#else
            for (int64_t d = 0; d < D; d++) {
                float wo = w * oc[d];
                acc[d] = acc[d] + wo;
            }
#endif
        }
        if (a->sinks) L = L + exp_s(sink - M);
        int64_t h = g * G + hh;
        for (int64_t d = 0; d < D; d++) st(a->out, a->out_bf16, (t * a->H + h) * D + d, acc[d] / L);
    }
}

/* q rows of block [t0, t0 + nr), group g, as f32 [D / 16][np2][16] (rg = r * G + hh; rows
 * past nr * G up to the power of two np2 are zeros): one d-chunk of every query vector is
 * contiguous, so the score loop addresses them at constant offsets. */
static void load_q(const Args *a, int64_t t0, int nr, int64_t g, float *qf) {
    int64_t G = a->G, D = a->D;
    int nrg = (int)(nr * G), np2 = 1;
    while (np2 < nrg) np2 *= 2;
    memset(qf, 0, (size_t)(D * np2) * sizeof(float));
    for (int r = 0; r < nr; r++)
        for (int64_t hh = 0; hh < G; hh++) {
            int64_t rg = r * G + hh, src = ((t0 + r) * a->H + g * G + hh) * D;
            for (int64_t d = 0; d < D; d++) qf[(d / 16 * np2 + rg) * 16 + (d & 15)] = ld(a->q, a->q_bf16, src + d);
        }
}

static void block_range(const Args *a, int64_t t0, int nr, int64_t *cb0, int64_t *cb1) {
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    for (int r = 0; r < nr; r++) {
        int64_t c_lo, c_hi;
        pieces_of(a, qp(a, t0 + r), &c_lo, &c_hi);
        lo = c_lo < lo ? c_lo : lo;
        hi = c_hi > hi ? c_hi : hi;
    }
    *cb0 = lo;
    *cb1 = hi;
}

/* Returns 0, -1 (bad shape or a row sees a key the source does not hold) or -2 (no memory). */
static int attend(Args *a, int nthreads) {
    int64_t T = a->T, D = a->D, KV = a->KV;
    if (D % 16 || D > DMAX || a->H % KV || a->H / KV > GMAX || T < 1) return -1;
    a->G = a->H / KV;
    a->R = 16 / a->G;
    for (int64_t t = 0; t < T; t++) {             /* every visible key must be in the source */
        int64_t p = qp(a, t);
        if (p < 0 || lo_of(a, p) < a->pos0 || p >= a->pos0 + a->S) return -1;
    }
    int64_t R = a->R, nblocks = (T + R - 1) / R, per = (int64_t)a->G * R;
    int64_t gmin = INT64_MAX, gmax = INT64_MIN, maxnp = 0;
    for (int64_t b = 0; b < nblocks; b++) {
        int64_t c0, c1;
        int nr = (int)(T - b * R < R ? T - b * R : R);
        block_range(a, b * R, nr, &c0, &c1);
        gmin = c0 < gmin ? c0 : gmin;
        gmax = c1 > gmax ? c1 : gmax;
        maxnp = c1 - c0 + 1 > maxnp ? c1 - c0 + 1 : maxnp;
    }
    int failed = 0;
    if (nblocks * KV >= 2 * (int64_t)nthreads || nthreads == 1) {
        /* blocks in parallel, each with its pieces in order and its merge */
        #pragma omp parallel num_threads(nthreads)
        {
            float *scr = (float *)malloc((size_t)(per * maxnp * (D + 2)) * sizeof(float));
            float *qf = (float *)malloc((size_t)(16 * D) * sizeof(float));
            if (!scr || !qf) {
                #pragma omp atomic write
                failed = 1;
            }
            #pragma omp for schedule(dynamic, 1)
            for (int64_t task = 0; task < nblocks * KV; task++) {
                if (!scr || !qf) continue;
                int64_t b = task / KV, g = task % KV, t0 = b * R, cb0, cb1;
                int nr = (int)(T - t0 < R ? T - t0 : R);
                block_range(a, t0, nr, &cb0, &cb1);
                load_q(a, t0, nr, g, qf);
                for (int64_t c = cb0; c <= cb1; c++) block_piece(a, t0, nr, g, c, qf, scr, cb0, cb1 - cb0 + 1);
                for (int r = 0; r < nr; r++) merge(a, t0, r, g, scr, cb0, cb1 - cb0 + 1);
            }
            free(scr);
            free(qf);
        }
        return failed ? -2 : 0;
    }
    /* few blocks (a decode step): (block, group, piece) tasks in parallel, then the merges */
    int64_t NP = gmax - gmin + 1, tasks = nblocks * KV * NP;
    float *scr = (float *)malloc((size_t)(nblocks * KV * per * NP * (D + 2) + 16 * D) * sizeof(float));
    if (!scr) return -2;
    if (tasks == 1 && T == 1) {                  /* one piece, one row: no thread team */
        float *qf = scr + per * NP * (D + 2);
        load_q(a, 0, 1, 0, qf);
        block_piece(a, 0, 1, 0, gmin, qf, scr, gmin, NP);
        merge(a, 0, 0, 0, scr, gmin, NP);
        free(scr);
        return 0;
    }
    #pragma omp parallel num_threads(tasks > 1 ? nthreads : 1)
    {
        float *qf = (float *)malloc((size_t)(16 * D) * sizeof(float));
        if (!qf) {
            #pragma omp atomic write
            failed = 1;
        }
        /* round robin: a window's first and last pieces are partial ([203, 256, 53] keys for a
         * 512-key window): dealt alternately, two threads get 256 keys each */
        #pragma omp for schedule(static, 1)
        for (int64_t task = 0; task < tasks; task++) {
            if (!qf) continue;
            int64_t c = gmin + task % NP, bg = task / NP, b = bg / KV, g = bg % KV, t0 = b * R;
            int nr = (int)(T - t0 < R ? T - t0 : R);
            load_q(a, t0, nr, g, qf);
            block_piece(a, t0, nr, g, c, qf, scr + bg * per * NP * (D + 2), gmin, NP);
        }
        free(qf);
    }
    if (failed) {
        free(scr);
        return -2;
    }
    #pragma omp parallel for schedule(static) num_threads(T * KV > 1 ? nthreads : 1)
    for (int64_t tg = 0; tg < T * KV; tg++) {
        int64_t t = tg / KV, g = tg % KV, b = t / R;
        merge(a, b * R, (int)(t - b * R), g, scr + (b * KV + g) * per * NP * (D + 2), gmin, NP);
    }
    free(scr);
    return 0;
}

/* q [T, H, D] at positions qpos[T] (or qpos0 .. qpos0 + T - 1 when qpos is NULL); keys/values as
 * described at the top; out [T, H, D].
 * D % 16 == 0, D <= 1024, H / KV <= 16. */
int muser_attend_rows_sinks(const void *q, int q_bf16, int64_t T, int64_t H, int64_t D, const int64_t *qpos,
                            int64_t qpos0, int64_t window, const void *k, const void *v, int kv_bf16, int64_t KV,
                            int64_t pos0, int64_t S, int64_t rot, int64_t cap, int64_t stride_s, int64_t stride_kv,
                            float scale, float softcap, const float *sinks, void *out, int out_bf16, int nthreads) {
    if (S < 1 || cap < S || rot < 0 || rot >= cap) return -1;
    Args a = {q, q_bf16, T, H, D, KV, 0, qpos, qpos0, window, k, v, kv_bf16, pos0, S, rot, cap, stride_s, stride_kv,
              scale, softcap, out, out_bf16, 0, sinks};
    return attend(&a, nthreads);
}

int muser_attend_rows(const void *q, int q_bf16, int64_t T, int64_t H, int64_t D, const int64_t *qpos,
                      int64_t qpos0, int64_t window, const void *k, const void *v, int kv_bf16, int64_t KV, int64_t pos0,
                      int64_t S, int64_t rot, int64_t cap, int64_t stride_s, int64_t stride_kv, float scale,
                      float softcap, void *out, int out_bf16, int nthreads) {
    return muser_attend_rows_sinks(q, q_bf16, T, H, D, qpos, qpos0, window, k, v, kv_bf16, KV, pos0, S, rot, cap,
                                   stride_s, stride_kv, scale, softcap, NULL, out, out_bf16, nthreads);
}

/* Every key visible (keys in storage order, positions 0..S-1, every query at S - 1). */
int muser_attend_visible(const void *q, int q_bf16, int64_t T, int64_t H, int64_t D,
                         const void *k, const void *v, int kv_bf16, int64_t S, int64_t KV,
                         int64_t stride_s, int64_t stride_kv, float scale, float softcap,
                         void *out, int out_bf16, int nthreads) {
    if (T < 1 || S < 1) return -1;
    int64_t *qpos = (int64_t *)malloc((size_t)T * sizeof(int64_t));
    if (!qpos) return -2;
    for (int64_t t = 0; t < T; t++) qpos[t] = S - 1;
    int rc = muser_attend_rows(q, q_bf16, T, H, D, qpos, 0, 0, k, v, kv_bf16, KV, 0, S, 0, S, stride_s, stride_kv,
                               scale, softcap, out, out_bf16, nthreads);
    free(qpos);
    return rc;
}
