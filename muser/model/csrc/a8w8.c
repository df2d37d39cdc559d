/* int8 x int8 linear with exact integer accumulation: every projection of the CPU default path.
 *
 *   per row m of x [M, K] (bf16 or f32), two int8 planes (~15-bit activations):
 *       amax = max_k |x[m, k]|,  s1 = amax / 127,  inv = 127 / amax,  s2 = s1 / 256
 *       x1 = clamp(rint(x * inv), +-127)          r = x - x1 * s1 (two roundings, no fma)
 *       x2 = clamp(rint(r * (inv * 256)), +-127)
 *   per output (m, n), with w [N, K] int8 and one f32 scale per output row n:
 *       A1 = sum_k x1[m, k] w[n, k],  A2 = sum_k x2[m, k] w[n, k]             (exact, int32)
 *       y[m, n] = ((float)A1 * s1 + (float)A2 * s2) * scale[n]                (f32, then bf16 RNE)
 *
 * Why: "one arithmetic per token" (issue 12).  A decode row, a verification block, a prefill
 * chunk of any size and a batched step must give a token bit-identical rows.  Integer sums
 * are exact whatever the order, so the tiling, the row count and the thread count cannot
 * change a bit; the quantization and the epilogue are row-local element-wise maths with no fma
 * (so `muser.model.native.a8w8_reference` reproduces them bit for bit in torch).  One plane
 * (per-row int8) costs 8x the float32 KL on the embedded model; two planes are as accurate as
 * bf16 activations x int8 weights in f32 (benchmarks/NOTES.md, "One arithmetic per token").
 *
 * Speed: AVX512-VNNI vpdpbusd does 64 u8 x s8 products per instruction (4x an f32 FMA, 2x a
 * bf16 dot).  Weights are packed once (`muser_a8w8_pack` layout below) as u8 = w + 128 so the
 * activations can be the signed operand; the +128 is removed with 128 * sum_k x[m, k]:
 *       sum_k (w + 128) x = sum_k w x + 128 sum_k x.
 * Packed layout, panels of 64 output rows (N padded to 64, K padded to 4 with zeros):
 *       wp[p][k4][j][i] = w[64 p + j, 4 k4 + i] + 128     (p < N/64, k4 < K/4, j < 64, i < 4)
 * so one k4 step of a panel is 256 contiguous bytes = 4 vectors of 16 outputs x 4 k.
 * Tiles: 6 plane rows (3 rows of x) x 64 outputs = 24 int32 accumulators; threads split the
 * panels.  Without AVX512-VNNI the same integers are summed by scalar code: same bits.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>
#define A8_VNNI 1
#elif defined(__AVX2__)
#include <immintrin.h>
#define A8_AVX2 1
#endif

#ifdef A8_VNNI
static inline __m512 vload16(const void *p, int bf16, int64_t i) {   /* 16 values as f32 */
    if (!bf16) return _mm512_loadu_ps((const float *)p + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
#endif

#define PANEL 64
#define MR 4             /* plane rows per tile: 2 rows of x, two planes each */

/* Quantize one row (K values) into planes p1, p2 (K4 * 4 bytes, zero padded).
 * Leaves s[0] = s1, s[1] = s2 and c[0], c[1] = 128 * sum of each plane. */
static void quant_row(const void *x, int bf16, int64_t K, int64_t Kp, int8_t *p1, int8_t *p2,
                      float *s, int32_t *c) {
    float amax = 0.0f;
    int nan = 0;
    int64_t k0 = 0;
#ifdef A8_VNNI
    __m512 vmax = _mm512_setzero_ps();
    __mmask16 vnan = 0;
    for (; k0 + 16 <= K; k0 += 16) {
        __m512 v = _mm512_abs_ps(vload16(x, bf16, k0));
        vnan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        vmax = _mm512_max_ps(vmax, v);
    }
    amax = _mm512_reduce_max_ps(vmax);           /* max is exact in any order */
    nan = vnan != 0;
#endif
    for (int64_t k = k0; k < K; k++) {
        float a = fabsf(ld(x, bf16, k));
        nan |= a != a;
        amax = a > amax ? a : amax;
    }
    memset(p1, 0, (size_t)Kp);
    memset(p2, 0, (size_t)Kp);
    c[0] = c[1] = 0;
    if (nan || isinf(amax) || amax == 0.0f) {      /* zeros: y = 0; inf or NaN: y = NaN */
        s[0] = s[1] = amax == 0.0f && !nan ? 0.0f : NAN;
        return;
    }
    float inv = 127.0f / amax, s1 = amax / 127.0f, inv2 = inv * 256.0f, s2 = s1 / 256.0f;
    int32_t c1 = 0, c2 = 0;
    k0 = 0;
#ifdef A8_VNNI
    {
        __m512 vinv = _mm512_set1_ps(inv), vs1 = _mm512_set1_ps(s1), vinv2 = _mm512_set1_ps(inv2);
        __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
        __m512i acc1 = _mm512_setzero_si512(), acc2 = _mm512_setzero_si512();
        for (; k0 + 16 <= K; k0 += 16) {
            __m512 v = vload16(x, bf16, k0);
            __m512 q1 = _mm512_roundscale_ps(_mm512_mul_ps(v, vinv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            q1 = _mm512_min_ps(_mm512_max_ps(q1, lo), hi);
            __m512 r = _mm512_sub_ps(v, _mm512_mul_ps(q1, vs1));
            __m512 q2 = _mm512_roundscale_ps(_mm512_mul_ps(r, vinv2), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            q2 = _mm512_min_ps(_mm512_max_ps(q2, lo), hi);
            __m512i i1 = _mm512_cvtps_epi32(q1), i2 = _mm512_cvtps_epi32(q2);
            acc1 = _mm512_add_epi32(acc1, i1);
            acc2 = _mm512_add_epi32(acc2, i2);
            _mm_storeu_si128((__m128i *)(p1 + k0), _mm512_cvtepi32_epi8(i1));
            _mm_storeu_si128((__m128i *)(p2 + k0), _mm512_cvtepi32_epi8(i2));
        }
        c1 = _mm512_reduce_add_epi32(acc1);       /* integer sums: exact in any order */
        c2 = _mm512_reduce_add_epi32(acc2);
    }
#endif
    for (int64_t k = k0; k < K; k++) {
        float v = ld(x, bf16, k);
        float q1 = rintf(v * inv);
        q1 = q1 > 127.0f ? 127.0f : (q1 < -127.0f ? -127.0f : q1);
        float prod = q1 * s1;
        float r = v - prod;
        float q2 = rintf(r * inv2);
        q2 = q2 > 127.0f ? 127.0f : (q2 < -127.0f ? -127.0f : q2);
        p1[k] = (int8_t)q1;
        p2[k] = (int8_t)q2;
        c1 += (int32_t)q1;
        c2 += (int32_t)q2;
    }
    s[0] = s1;
    s[1] = s2;
    c[0] = 128 * c1;
    c[1] = 128 * c2;
}

/* y = ((float)A1 * s1 + (float)A2 * s2) * scale; written as two products and a sum so that
 * the compiler cannot fuse them (the C file is built with -ffp-contract=off as well). */
static inline float epilogue(int32_t a1, int32_t a2, const float *s, float scale) {
    float t1 = (float)a1 * s[0];
    float t2 = (float)a2 * s[1];
    float t = t1 + t2;
    return t * scale;
}

/* y[off + j] = epilogue(a1[j] - c[0], a2[j] - c[1]) for j < cnt; vector and scalar give the same bits
 * (int -> float conversion, products and sums in round-to-nearest-even; bf16 by the same integer RNE). */
static void store_outputs(const int32_t *a1, const int32_t *a2, const int32_t *c, const float *s,
                          const float *scale, int64_t cnt, void *y, int y_bf16, int64_t off, int fast) {
    int64_t j = 0;
#ifdef A8_VNNI
    if (fast) {
        __m512i c1 = _mm512_set1_epi32(c[0]), c2 = _mm512_set1_epi32(c[1]);
        __m512 s1 = _mm512_set1_ps(s[0]), s2 = _mm512_set1_ps(s[1]);
        for (; j < cnt; j += 16) {
            __mmask16 mk = cnt - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (cnt - j)) - 1);
            __m512 t1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_loadu_si512(a1 + j), c1)), s1);
            __m512 t2 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_loadu_si512(a2 + j), c2)), s2);
            __m512 v = _mm512_mul_ps(_mm512_add_ps(t1, t2), _mm512_maskz_loadu_ps(mk, scale + j));
            if (!y_bf16) {
                _mm512_mask_storeu_ps((float *)y + off + j, mk, v);
                continue;
            }
            __m512i u = _mm512_castps_si512(v);
            __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
            __m512i rne = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
            __mmask16 isnan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                      _mm512_set1_epi32(0x7f800000));
            __m512i qnan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
            __m256i h = _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(isnan, rne, qnan));
            _mm256_mask_storeu_epi16((uint16_t *)y + off + j, mk, h);
        }
        return;
    }
#endif
    for (; j < cnt; j++) st(y, y_bf16, off + j, epilogue(a1[j] - c[0], a2[j] - c[1], s, scale[j]));
}

/* Raw sums of plane rows xq [rows][Kp] against panel wp (Kp / 4 steps of 256 bytes):
 * acc[r][j] = sum_k xq[r][k] * wp_u8[j][k] for j < 64.  Scalar reference / fallback. */
static void tile_generic(const int8_t *xq, int rows, int64_t Kp, const uint8_t *wp, int32_t *acc) {
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < PANEL; j++) {
            int32_t a = 0;
            for (int64_t k4 = 0; k4 < Kp / 4; k4++)
                for (int i = 0; i < 4; i++)
                    a += (int32_t)xq[r * Kp + 4 * k4 + i] * (int32_t)wp[k4 * 256 + j * 4 + i];
            acc[r * PANEL + j] = a;
        }
}

#ifdef A8_AVX2
/* The same sums on AVX2 (no VNNI), llama.cpp's sign trick: |x| (u8) times w carrying x's sign
 * (s8), so vpmaddubsw's pair sums stay within int16 (2 * 127 * 127 < 32767: never saturate),
 * then vpmaddwd by ones into int32.  Half a panel (32 outputs) per pass: 8 accumulators. */
static void tile_avx2(const int8_t *xq, int rows, int64_t Kp, const uint8_t *wp, int32_t *acc) {
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    for (int half = 0; half < 2; half++) {
        __m256i a[2][4];
        for (int r = 0; r < 2; r++)
            for (int v = 0; v < 4; v++) a[r][v] = _mm256_setzero_si256();
        for (int r0 = 0; r0 < rows; r0 += 2) {
            for (int64_t k4 = 0; k4 < Kp / 4; k4++) {
                const uint8_t *w = wp + k4 * 256 + half * 128;
                __m256i ws[4];
                for (int v = 0; v < 4; v++)      /* u8 (w + 128) -> s8 w */
                    ws[v] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w + 32 * v)), flip);
                for (int r = 0; r < 2; r++) {
                    int32_t xv;
                    memcpy(&xv, xq + (r0 + r) * Kp + 4 * k4, 4);
                    __m256i xb = _mm256_set1_epi32(xv), xa = _mm256_abs_epi8(xb);
                    for (int v = 0; v < 4; v++) {
                        __m256i p16 = _mm256_maddubs_epi16(xa, _mm256_sign_epi8(ws[v], xb));
                        a[r][v] = _mm256_add_epi32(a[r][v], _mm256_madd_epi16(p16, ones));
                    }
                }
            }
            for (int r = 0; r < 2; r++)
                for (int v = 0; v < 4; v++) {
                    _mm256_storeu_si256((__m256i *)(acc + (r0 + r) * PANEL + half * 32 + 8 * v), a[r][v]);
                    a[r][v] = _mm256_setzero_si256();
                }
        }
    }
}
#endif

#ifdef A8_VNNI
/* The same sums with vpdpbusd: `rows` (2 or 4) plane rows x 64 outputs, 16 accumulators, the
 * 4 weight vectors of a k4 step loaded once and the 4-byte activation groups broadcast. */
#define A8_STEP(R)                                                                         \
    {                                                                                      \
        int32_t xv;                                                                        \
        memcpy(&xv, xq + (R) * Kp + 4 * k4, 4);                                            \
        __m512i b = _mm512_set1_epi32(xv);                                                 \
        a##R##0 = _mm512_dpbusd_epi32(a##R##0, w0, b);                                     \
        a##R##1 = _mm512_dpbusd_epi32(a##R##1, w1, b);                                     \
        a##R##2 = _mm512_dpbusd_epi32(a##R##2, w2, b);                                     \
        a##R##3 = _mm512_dpbusd_epi32(a##R##3, w3, b);                                     \
    }
/* Keep the four weight vectors in registers: GCC otherwise reloads them for every row. */
#define A8_PIN(a, b, c, d) __asm__("" : "+v"(a), "+v"(b), "+v"(c), "+v"(d));
#define A8_STORE(R)                                                                        \
    _mm512_storeu_si512(acc + (R) * PANEL, a##R##0);                                       \
    _mm512_storeu_si512(acc + (R) * PANEL + 16, a##R##1);                                  \
    _mm512_storeu_si512(acc + (R) * PANEL + 32, a##R##2);                                  \
    _mm512_storeu_si512(acc + (R) * PANEL + 48, a##R##3);

static void tile_vnni(const int8_t *xq, int rows, int64_t Kp, const uint8_t *wp, int32_t *acc,
                      const uint8_t *prefetch) {
    __m512i z = _mm512_setzero_si512();
    __m512i a00 = z, a01 = z, a02 = z, a03 = z, a10 = z, a11 = z, a12 = z, a13 = z;
    __m512i a20 = z, a21 = z, a22 = z, a23 = z, a30 = z, a31 = z, a32 = z, a33 = z;
    int64_t K4 = Kp / 4;
    if (rows == 4) {
        for (int64_t k4 = 0; k4 < K4; k4++) {
            const uint8_t *w = wp + k4 * 256;
            if (prefetch) {             /* stream the next panel in while this one is summed */
                const char *pf = (const char *)(prefetch + k4 * 256);
                _mm_prefetch(pf, _MM_HINT_T0);
                _mm_prefetch(pf + 64, _MM_HINT_T0);
                _mm_prefetch(pf + 128, _MM_HINT_T0);
                _mm_prefetch(pf + 192, _MM_HINT_T0);
            }
            __m512i w0 = _mm512_loadu_si512(w), w1 = _mm512_loadu_si512(w + 64);
            __m512i w2 = _mm512_loadu_si512(w + 128), w3 = _mm512_loadu_si512(w + 192);
            A8_PIN(w0, w1, w2, w3)
            A8_STEP(0) A8_STEP(1) A8_STEP(2) A8_STEP(3)
        }
        A8_STORE(0) A8_STORE(1) A8_STORE(2) A8_STORE(3)
        return;
    }
    for (int64_t k4 = 0; k4 < K4; k4++) {     /* rows == 2: one row of x (a decode step) */
        const uint8_t *w = wp + k4 * 256;
        if (prefetch) {
            const char *pf = (const char *)(prefetch + k4 * 256);
            _mm_prefetch(pf, _MM_HINT_T0);
            _mm_prefetch(pf + 64, _MM_HINT_T0);
            _mm_prefetch(pf + 128, _MM_HINT_T0);
            _mm_prefetch(pf + 192, _MM_HINT_T0);
        }
        __m512i w0 = _mm512_loadu_si512(w), w1 = _mm512_loadu_si512(w + 64);
        __m512i w2 = _mm512_loadu_si512(w + 128), w3 = _mm512_loadu_si512(w + 192);
        A8_PIN(w0, w1, w2, w3)
        A8_STEP(0) A8_STEP(1)
    }
    A8_STORE(0) A8_STORE(1)
}
#endif

/* Pack w [N, K] int8 into `out` (muser_a8w8_packed_bytes(N, K) bytes), layout above. */
int64_t muser_a8w8_packed_bytes(int64_t N, int64_t K) {
    return (N + PANEL - 1) / PANEL * PANEL * ((K + 3) / 4 * 4);
}

void muser_a8w8_pack(const int8_t *w, int64_t N, int64_t K, uint8_t *out) {
    int64_t P = (N + PANEL - 1) / PANEL, K4 = (K + 3) / 4;
    for (int64_t p = 0; p < P; p++)
        for (int64_t k4 = 0; k4 < K4; k4++)
            for (int j = 0; j < PANEL; j++)
                for (int i = 0; i < 4; i++) {
                    int64_t n = p * PANEL + j, k = 4 * k4 + i;
                    int8_t v = (n < N && k < K) ? w[n * K + k] : 0;
                    out[((p * K4 + k4) * PANEL + j) * 4 + i] = (uint8_t)((int)v + 128);
                }
}

/* x [M, K] (bf16 when x_bf16, else f32), packed weights wp, scale [N] f32 -> y [M, N]
 * (bf16 when y_bf16, else f32).  Returns 0, or -1 when scratch cannot be allocated. */
int muser_a8w8_linear(const void *x, int x_bf16, int64_t M, int64_t K, const uint8_t *wp,
                      const float *scale, int64_t N, void *y, int y_bf16, int nthreads) {
    int64_t Kp = (K + 3) / 4 * 4, P = (N + PANEL - 1) / PANEL;
    /* plane rows: 2m = plane 1 of row m, 2m + 1 = plane 2 */
    /* one allocation: s [2M] f32, c [2M] int32, then the planes [2M][Kp] */
    char *buf = (char *)malloc((size_t)(2 * M * (4 + 4 + Kp)));
    if (!buf) return -1;
    float *s = (float *)buf;
    int32_t *c = (int32_t *)(buf + 8 * M);
    int8_t *xq = (int8_t *)(buf + 16 * M);
    int64_t esz = x_bf16 ? 2 : 4;
    if (M >= 16) {
        #pragma omp parallel for schedule(static) num_threads(nthreads)
        for (int64_t m = 0; m < M; m++)
            quant_row((const char *)x + m * K * esz, x_bf16, K, Kp, xq + 2 * m * Kp, xq + (2 * m + 1) * Kp,
                      s + 2 * m, c + 2 * m);
    } else {                                   /* a decode step: no thread team for 640 values */
        for (int64_t m = 0; m < M; m++)
            quant_row((const char *)x + m * K * esz, x_bf16, K, Kp, xq + 2 * m * Kp, xq + (2 * m + 1) * Kp,
                      s + 2 * m, c + 2 * m);
    }
    int fast = 0;
#ifdef A8_VNNI
    fast = 1;
#endif
    #pragma omp parallel for schedule(static) num_threads(P > 1 ? nthreads : 1)
    for (int64_t p = 0; p < P; p++) {
        const uint8_t *panel = wp + p * (Kp / 4) * 256;
        const uint8_t *next = p + 1 < P ? panel + (Kp / 4) * 256 : NULL;
        int32_t acc[MR * PANEL];
        for (int64_t r0 = 0; r0 < 2 * M; r0 += MR) {
            int rows = (int)(2 * M - r0 < MR ? 2 * M - r0 : MR);
            const int8_t *xr = xq + r0 * Kp;
            const uint8_t *pf = r0 == 0 ? next : NULL;
#ifdef A8_VNNI
            if (fast) {
                tile_vnni(xr, rows, Kp, panel, acc, pf);
            }
#endif
#ifdef A8_AVX2
            tile_avx2(xr, rows, Kp, panel, acc);  /* sums in the packed order: u8 - 128 = w */
            for (int r = 0; r < rows; r++)        /* the VNNI path's raw sums include + 128 sum x */
                for (int j = 0; j < PANEL; j++) acc[r * PANEL + j] += c[r0 + r];
#else
            if (!fast) tile_generic(xr, rows, Kp, panel, acc);
#endif
            for (int r = 0; r < rows; r += 2) {
                int64_t m = (r0 + r) / 2;
                int64_t n0 = p * PANEL, cnt = N - n0 < PANEL ? N - n0 : PANEL;
                store_outputs(acc + r * PANEL, acc + (r + 1) * PANEL, c + 2 * m, s + 2 * m, scale + n0,
                              cnt, y, y_bf16, m * N + n0, fast);
            }
        }
    }
    free(buf);
    return 0;
}
