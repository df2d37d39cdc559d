/* Grouped-query attention where every key is visible (a CPU decode step).
 *
 *   for each query row t, head h (KV group g = h / (H / KV)):
 *       s[j]  = scale * <q[t, h], k[j, g]>          softcap: s = cap * tanh(s / cap)
 *       p[j]  = exp(s[j] - max s)
 *       out[t, h] = (sum_j p[j] v[j, g]) / (sum_j p[j])                    (f32 throughout)
 *
 * Keys/values are read where they live: k[j, g, :] is at k + j * stride_s + g * stride_kv
 * (a token-major ring: stride_s = KV * D, stride_kv = D; a head-major growing plane:
 * stride_s = D, stride_kv = allocated * D), the head dim contiguous.  In eager torch
 * this was ~15 ops per layer (casts, permutes, two matmuls, softmax).
 *
 * Every (t, h) is computed by one thread in a fixed order (dot products in 16
 * lanes then a fixed reduction; keys in row order), so the result does not
 * depend on the thread count or on which other rows are in the call.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline float ld(const void *p, int bf16, int64_t i) {
    if (!bf16) return ((const float *)p)[i];
    uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline void st(void *p, int bf16, int64_t i, float f) {
    if (!bf16) { ((float *)p)[i] = f; return; }
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) { ((uint16_t *)p)[i] = (uint16_t)((u >> 16) | 0x40u); return; }
    u += 0x7fffu + ((u >> 16) & 1u);                       /* round to nearest even, as torch */
    ((uint16_t *)p)[i] = (uint16_t)(u >> 16);
}

/* D % 16 == 0 and D <= 1024.  Returns 0, -1 (bad shape) or -2 (no memory). */
int muser_attend_visible(const void *q, int q_bf16, int64_t T, int64_t H, int64_t D,
                         const void *k, const void *v, int kv_bf16, int64_t S, int64_t KV,
                         int64_t stride_s, int64_t stride_kv, float scale, float softcap,
                         void *out, int out_bf16, int nthreads) {
    if (D % 16 || D > 1024 || H % KV || S < 1) return -1;
    int64_t group = H / KV;
    int failed = 0;
    #pragma omp parallel for schedule(static) num_threads(T * H > 1 ? nthreads : 1)
    for (int64_t r = 0; r < T * H; r++) {
        int64_t t = r / H, h = r % H, g = h / group;
        float qf[1024], acc[1024];
        float *s = (float *)malloc((size_t)S * sizeof(float));
        if (!s) { failed = 1; continue; }
        for (int64_t d = 0; d < D; d++) qf[d] = ld(q, q_bf16, (t * H + h) * D + d);
        float mx = -INFINITY;
        for (int64_t j = 0; j < S; j++) {
            int64_t base = j * stride_s + g * stride_kv;
            float lane[16] = {0};
            for (int64_t d = 0; d < D; d += 16)
                for (int l = 0; l < 16; l++) lane[l] += qf[d + l] * ld(k, kv_bf16, base + d + l);
            float dot = 0.0f;
            for (int l = 0; l < 16; l++) dot += lane[l];
            float x = dot * scale;
            if (softcap > 0.0f) x = softcap * tanhf(x / softcap);
            s[j] = x;
            if (x > mx) mx = x;
        }
        float denom = 0.0f;
        for (int64_t j = 0; j < S; j++) { s[j] = expf(s[j] - mx); denom += s[j]; }
        for (int64_t d = 0; d < D; d++) acc[d] = 0.0f;
        for (int64_t j = 0; j < S; j++) {
            int64_t base = j * stride_s + g * stride_kv;
            float p = s[j];
            for (int64_t d = 0; d < D; d++) acc[d] += p * ld(v, kv_bf16, base + d);
        }
        for (int64_t d = 0; d < D; d++) st(out, out_bf16, (t * H + h) * D + d, acc[d] / denom);
        free(s);
    }
    return failed ? -2 : 0;
}
