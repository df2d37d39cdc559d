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
 *            (products then sums, c ascending)
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
#ifdef __AVX512F__
#include <immintrin.h>
#endif

#define PIECE 256
#define GMAX 16       /* heads per KV group */
#define DMAX 1024

typedef struct {
    const void *q; int q_bf16; int64_t T, H, D, KV, G;
    const int64_t *qpos; int64_t window;
    const void *k, *v; int kv_bf16; int64_t pos0, S, rot, cap, stride_s, stride_kv;
    float scale, softcap;
    void *out; int out_bf16;
    int64_t R;           /* rows per block */
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
static inline int64_t lo_of(const Args *a, int64_t p) {
    return a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
}

static inline int64_t key_off(const Args *a, int64_t j, int64_t g) {
    int64_t r = a->rot + (j - a->pos0);
    if (r >= a->cap) r -= a->cap;
    return r * a->stride_s + g * a->stride_kv;
}

/* ------------------------------------------------------------------ one piece of one block */
/* Slot of (rg, piece index pc) in a block's scratch: m, l, o[D]. */
static inline float *slot(float *base, int64_t rg, int64_t pc, int64_t NP, int64_t D) {
    return base + (rg * NP + pc) * (D + 2);
}

/* Scores of keys [A, B) for query vectors qf (layout [D / 16][NP2][16], NP2 = the row count
 * rounded up to a power of two, padding rows zero) into S[rg][j - c0], rg < nrg. */
#ifdef __AVX512F__
/* Tiles of RG query vectors x KB keys (RG * KB = 16 dots per reduction): rg0 .. rg0 + RG. */
static inline __attribute__((always_inline)) void scores_n(const Args *a, int64_t g, const float *qf, const int NP2,
                                                           const int RG, int nrg, int64_t A, int64_t B, int64_t c0,
                                                           float (*S)[PIECE]) {
    const int KB = 16 / RG;
    int64_t D = a->D;
    for (int64_t j = A; j < B; j += KB) {
        const char *kp[16];
        for (int kk = 0; kk < KB; kk++)
            kp[kk] = (const char *)a->k + key_off(a, j + kk < B ? j + kk : B - 1, g) * (a->kv_bf16 ? 2 : 4);
        for (int rg0 = 0; rg0 < NP2 && rg0 < nrg; rg0 += RG) {
            __m512 acc[16];
            for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
#define SCORE_LOOP(BF16)                                                                       \
            for (int64_t d = 0; d < D; d += 16) {                                              \
                const float *qd = qf + d * NP2 + 16 * rg0;                                     \
                __m512 kv[16];                                                                 \
                for (int kk = 0; kk < KB; kk++) kv[kk] = vld(kp[kk], BF16, d);                 \
                for (int i = 0; i < RG; i++) {                                                 \
                    __m512 qv = _mm512_loadu_ps(qd + 16 * i);                                  \
                    for (int kk = 0; kk < KB; kk++)                                            \
                        acc[kk * RG + i] = _mm512_fmadd_ps(qv, kv[kk], acc[kk * RG + i]);      \
                }                                                                              \
            }
            if (a->kv_bf16) { SCORE_LOOP(1) } else { SCORE_LOOP(0) }
#undef SCORE_LOOP
            float dots[16];
            _mm512_storeu_ps(dots, reduce16(acc));
            for (int kk = 0; kk < KB && j + kk < B; kk++)
                for (int i = 0; i < RG && rg0 + i < nrg; i++)
                    S[rg0 + i][j + kk - c0] = score_post(dots[kk * RG + i], a->scale, a->softcap);
        }
    }
}
#endif

static void scores(const Args *a, int64_t g, const float *qf, int np2, int nrg, int64_t A, int64_t B, int64_t c0,
                   float (*S)[PIECE]) {
#ifdef __AVX512F__
    switch (np2) {
    case 16: scores_n(a, g, qf, 16, 16, nrg, A, B, c0, S); break;
    case 8: scores_n(a, g, qf, 8, 8, nrg, A, B, c0, S); break;
    case 4: scores_n(a, g, qf, 4, 4, nrg, A, B, c0, S); break;
    case 2: scores_n(a, g, qf, 2, 2, nrg, A, B, c0, S); break;
    default: scores_n(a, g, qf, 1, 1, nrg, A, B, c0, S); break;
    }
#else
    int64_t D = a->D;
    for (int64_t j = A; j < B; j++) {
        int64_t off = key_off(a, j, g);
        for (int i = 0; i < nrg; i++) {
            float lane[16] = {0};
            for (int64_t d = 0; d < D; d++)
                lane[d & 15] = fmaf(qf[(d / 16 * np2 + i) * 16 + (d & 15)], ld(a->k, a->kv_bf16, off + d), lane[d & 15]);
            S[i][j - c0] = score_post(tree16(lane), a->scale, a->softcap);
        }
    }
#endif
}

/* m, l of one (row, head) over its keys [lo, hi) of the piece starting at c0; E = exp(S - m) in place. */
static void softmax_piece(float *Srow, int64_t lo, int64_t hi, int64_t c0, float *m_out, float *l_out) {
    int64_t a0 = lo - c0, a1 = hi - c0;           /* indices into Srow; lanes = absolute j mod 16 */
    float mx = -INFINITY;
#ifdef __AVX512F__
    int64_t b0 = a0 & ~(int64_t)15;
    __m512 vm = _mm512_set1_ps(-INFINITY);
    for (int64_t i = b0; i < a1; i += 16) {
        __mmask16 mk = (__mmask16)0xffff;
        if (i < a0) mk &= (__mmask16)(0xffffu << (a0 - i));
        if (a1 - i < 16) mk &= (__mmask16)((1u << (a1 - i)) - 1);
        vm = _mm512_mask_max_ps(vm, mk, vm, _mm512_maskz_loadu_ps(mk, Srow + i));
    }
    mx = _mm512_reduce_max_ps(vm);                /* max: exact in any order */
    __m512 vmx = _mm512_set1_ps(mx), acc = _mm512_setzero_ps();
    for (int64_t i = b0; i < a1; i += 16) {
        __mmask16 mk = (__mmask16)0xffff;
        if (i < a0) mk &= (__mmask16)(0xffffu << (a0 - i));
        if (a1 - i < 16) mk &= (__mmask16)((1u << (a1 - i)) - 1);
        __m512 e = exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, Srow + i), vmx));
        _mm512_mask_storeu_ps(Srow + i, mk, e);
        acc = _mm512_mask_add_ps(acc, mk, acc, e);
    }
    float lanes[16];
    _mm512_storeu_ps(lanes, acc);
#else
    for (int64_t i = a0; i < a1; i++) mx = Srow[i] > mx ? Srow[i] : mx;
    float lanes[16] = {0};
    for (int64_t i = a0; i < a1; i++) {
        Srow[i] = exp_s(Srow[i] - mx);
        lanes[i & 15] += Srow[i];
    }
#endif
    *m_out = mx;
    *l_out = tree16(lanes);
}

/* o[rg][d] = sum over that rg's keys of E[rg][j] v_j[d] (j ascending), for keys [A, B). */
#ifdef __AVX512F__
/* Tiles of RG (row, head) accumulators x DC d-chunks of 16 (RG * DC <= 16 registers): each v
 * chunk converted once for RG rows, each weight e broadcast once for DC chunks.  Keys
 * [j0, j1) for every rg of the tile, or only where the rg sees them (`MASKED`). */
#define PV_RANGE(BF16, MASKED)                                                                 \
    for (int64_t j = j0; j < j1; j++) {                                                        \
        const char *vr = vb + key_off(a, j, g) * esz;                                          \
        __m512 vv[16];                                                                         \
        for (int c = 0; c < DC; c++) vv[c] = vld(vr, BF16, d + 16 * c);                        \
        const float *e = &E[rg0][j - c0];                                                      \
        for (int i = 0; i < RG; i++)                                                           \
            if (!(MASKED) || (rg0 + i < nrg && j >= klo[rg0 + i] && j < khi[rg0 + i])) {       \
                __m512 ev = _mm512_set1_ps(e[i * PIECE]);                                      \
                for (int c = 0; c < DC; c++) acc[i * DC + c] = _mm512_fmadd_ps(ev, vv[c], acc[i * DC + c]); \
            }                                                                                  \
    }

static inline __attribute__((always_inline)) void pv_n(const Args *a, int64_t g, float (*E)[PIECE], const int NP2,
                                                       const int RG, const int DC, int nrg, const int64_t *klo,
                                                       const int64_t *khi, int64_t all_lo, int64_t all_hi,
                                                       int64_t A, int64_t B, int64_t c0, float **o) {
    int64_t D = a->D;
    int esz = a->kv_bf16 ? 2 : 4;
    const char *vb = (const char *)a->v;
    for (int rg0 = 0; rg0 < NP2 && rg0 < nrg; rg0 += RG)
        for (int64_t d = 0; d < D; d += 16 * DC) {
            __m512 acc[16];
            for (int i = 0; i < RG * DC; i++) acc[i] = _mm512_setzero_ps();
            int64_t j0 = A, j1 = all_lo;
            if (a->kv_bf16) { PV_RANGE(1, 1) } else { PV_RANGE(0, 1) }
            j0 = all_lo; j1 = all_hi;
            if (a->kv_bf16) { PV_RANGE(1, 0) } else { PV_RANGE(0, 0) }
            j0 = all_hi; j1 = B;
            if (a->kv_bf16) { PV_RANGE(1, 1) } else { PV_RANGE(0, 1) }
            for (int i = 0; i < RG && rg0 + i < nrg; i++)
                for (int c = 0; c < DC; c++) _mm512_storeu_ps(o[rg0 + i] + d + 16 * c, acc[i * DC + c]);
        }
}
#undef PV_RANGE
#endif

static void pv(const Args *a, int64_t g, float (*E)[PIECE], int np2, int nrg, const int64_t *klo,
               const int64_t *khi, int64_t A, int64_t B, int64_t c0, float **o) {
    int64_t all_lo = A, all_hi = B;
    for (int i = 0; i < nrg; i++) {
        all_lo = klo[i] > all_lo ? klo[i] : all_lo;
        all_hi = khi[i] < all_hi ? khi[i] : all_hi;
    }
    if (all_hi < all_lo) all_hi = all_lo;
#ifdef __AVX512F__
    int64_t dch = a->D / 16;                     /* d-chunks: the tile takes 2 or 4 when they divide */
    if (np2 >= 8 && dch % 2 == 0) pv_n(a, g, E, np2, 8, 2, nrg, klo, khi, all_lo, all_hi, A, B, c0, o);
    else if (np2 <= 4 && dch % 4 == 0) pv_n(a, g, E, np2, 4, 4, nrg, klo, khi, all_lo, all_hi, A, B, c0, o);
    else pv_n(a, g, E, np2, 16, 1, nrg, klo, khi, all_lo, all_hi, A, B, c0, o);
#else
    (void)np2;
    int64_t D = a->D;
    for (int i = 0; i < nrg; i++) {
        for (int64_t d = 0; d < D; d++) o[i][d] = 0.0f;
        for (int64_t j = klo[i]; j < khi[i]; j++) {
            int64_t off = key_off(a, j, g);
            for (int64_t d = 0; d < D; d++) o[i][d] = fmaf(E[i][j - c0], ld(a->v, a->kv_bf16, off + d), o[i][d]);
        }
    }
#endif
}

/* Rows [t0, t0 + nr) of group g, piece c: partials into slots (rg, c - cb0) of `base`. */
static void block_piece(const Args *a, int64_t t0, int nr, int64_t g, int64_t c, const float *qf,
                        float *base, int64_t cb0, int64_t NP) {
    int64_t G = a->G, D = a->D, c0 = c * PIECE;
    int nrg = (int)(nr * G), np2 = 1;
    while (np2 < nrg) np2 *= 2;
    int64_t klo[16], khi[16], A = INT64_MAX, B = INT64_MIN;
    for (int r = 0; r < nr; r++) {
        int64_t p = a->qpos[t0 + r], lo = lo_of(a, p);
        int64_t x0 = lo > c0 ? lo : c0, x1 = p + 1 < c0 + PIECE ? p + 1 : c0 + PIECE;
        for (int hh = 0; hh < G; hh++) {
            klo[r * G + hh] = x0;
            khi[r * G + hh] = x1;
        }
        if (x0 < x1) {
            A = x0 < A ? x0 : A;
            B = x1 > B ? x1 : B;
        }
    }
    if (A >= B) return;
    float S[16][PIECE];
    scores(a, g, qf, np2, nrg, A, B, c0, S);
    float *o[16];
    for (int i = 0; i < nrg; i++) {
        float *sl = slot(base, i, c - cb0, NP, D);
        o[i] = sl + 2;
        if (klo[i] < khi[i]) softmax_piece(S[i], klo[i], khi[i], c0, sl, sl + 1);
        else { klo[i] = khi[i] = A; }             /* this row does not see this piece */
    }
    pv(a, g, S, np2, nrg, klo, khi, A, B, c0, o);
}

/* The pieces row p sees: [c_lo, c_hi]. */
static inline void pieces_of(const Args *a, int64_t p, int64_t *c_lo, int64_t *c_hi) {
    *c_lo = lo_of(a, p) / PIECE;
    *c_hi = p / PIECE;
}

/* Merge the pieces of row t0 + r (head hh of group g) from the block scratch into out. */
static void merge(const Args *a, int64_t t0, int r, int64_t g, float *base, int64_t cb0, int64_t NP) {
    int64_t G = a->G, D = a->D, t = t0 + r, c_lo, c_hi;
    pieces_of(a, a->qpos[t], &c_lo, &c_hi);
    for (int64_t hh = 0; hh < G; hh++) {
        int64_t rg = r * G + hh;
        float M = -INFINITY, L = 0.0f, acc[DMAX];
        for (int64_t c = c_lo; c <= c_hi; c++) {
            float mc = slot(base, rg, c - cb0, NP, D)[0];
            M = mc > M ? mc : M;
        }
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
        pieces_of(a, a->qpos[t0 + r], &c_lo, &c_hi);
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
        int64_t p = a->qpos[t];
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
    float *scr = (float *)malloc((size_t)(nblocks * KV * per * NP * (D + 2)) * sizeof(float));
    if (!scr) return -2;
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

/* q [T, H, D] at positions qpos[T]; keys/values as described at the top; out [T, H, D].
 * D % 16 == 0, D <= 1024, H / KV <= 16. */
int muser_attend_rows(const void *q, int q_bf16, int64_t T, int64_t H, int64_t D, const int64_t *qpos,
                      int64_t window, const void *k, const void *v, int kv_bf16, int64_t KV, int64_t pos0,
                      int64_t S, int64_t rot, int64_t cap, int64_t stride_s, int64_t stride_kv, float scale,
                      float softcap, void *out, int out_bf16, int nthreads) {
    if (S < 1 || cap < S || rot < 0 || rot >= cap) return -1;
    Args a = {q, q_bf16, T, H, D, KV, 0, qpos, window, k, v, kv_bf16, pos0, S, rot, cap, stride_s, stride_kv,
              scale, softcap, out, out_bf16, 0};
    return attend(&a, nthreads);
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
    int rc = muser_attend_rows(q, q_bf16, T, H, D, qpos, 0, k, v, kv_bf16, KV, 0, S, 0, S, stride_s, stride_kv,
                               scale, softcap, out, out_bf16, nthreads);
    free(qpos);
    return rc;
}
