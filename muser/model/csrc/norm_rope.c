/* RMS norm and RoPE in one pass over rows of heads (CPU).
 *
 *   for each row t, head n:   v = x[t, n, :]                         (f32)
 *       if w:    v = v * (1 / sqrt(mean(v^2) + eps)) * w             (RMS norm, effective weight)
 *       if cos:  rotate v by (cos[t, i], sin[t, i]) on pairs
 *                   half-rotation (Llama, Gemma): (v[i], v[i + D/2])
 *                   interleaved   (Cohere):       (v[2i], v[2i + 1])
 *       y[t, n, :] = v                                                (f32 or bf16)
 *
 * One kernel serves the three uses of a decoder layer: the hidden-state norms
 * (N = 1, no rotation), q/k-norm + RoPE (N heads), RoPE alone (w = NULL).  In
 * eager torch each use is 6-12 small ops of ~2-5 us; on a 270M model at decode
 * that was ~3 ms of a ~20 ms token (benchmarks/NOTES.md, "CPU decode").
 *
 * Rows are independent and a row is computed by one thread in a fixed order,
 * so results do not depend on the row count or the thread count.
 * x rows may be strided (q and k are column slices of the fused q|k|v output);
 * heads within a row are contiguous, y is contiguous [T, N, D].
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common.h"

/* D <= 8192.  Returns 0, or -1 for an unsupported head size. */
int muser_norm_rope(const void *x, int x_bf16, int64_t T, int64_t N, int64_t D, int64_t stride_t,
                    const float *w, float eps, const float *cos_t, const float *sin_t, int interleaved,
                    void *y, int y_bf16, int nthreads) {
    if (D > 8192 || (cos_t && D % 2)) return -1;
    #pragma omp parallel for schedule(static) num_threads(T * N >= 64 ? nthreads : 1)
    for (int64_t r = 0; r < T * N; r++) {
        int64_t t = r / N, n = r % N;
        float v[8192];
        int64_t src = t * stride_t + n * D, dst = r * D;
        for (int64_t d = 0; d < D; d++) v[d] = ld(x, x_bf16, src + d);
        if (w) {
            float ss = 0.0f;
            for (int64_t d = 0; d < D; d++) ss += v[d] * v[d];
            float inv = 1.0f / sqrtf(ss / (float)D + eps);
            for (int64_t d = 0; d < D; d++) v[d] = v[d] * inv * w[d];
        }
        if (cos_t) {
            int64_t h = D / 2;
            const float *c = cos_t + t * h, *s = sin_t + t * h;
            for (int64_t i = 0; i < h; i++) {
                int64_t a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + h;
                float x0 = v[a], x1 = v[b];
                v[a] = x0 * c[i] - x1 * s[i];
                v[b] = x1 * c[i] + x0 * s[i];
            }
        }
        for (int64_t d = 0; d < D; d++) st(y, y_bf16, dst + d, v[d]);
    }
    return 0;
}
