/* Shared by the kernels in this directory: bf16 <-> f32 the way torch converts. */
#ifndef MUSER_COMMON_H
#define MUSER_COMMON_H
#include <stdint.h>
#include <string.h>

static inline float bf16_to_f32(uint16_t h) {      /* exact */
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {      /* round to nearest even, as torch does */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);   /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* element i of a f32 or bf16 array, as f32 */
static inline float ld(const void *p, int bf16, int64_t i) {
    return bf16 ? bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* store f into element i of a f32 or bf16 array */
static inline void st(void *p, int bf16, int64_t i, float f) {
    if (bf16) ((uint16_t *)p)[i] = f32_to_bf16(f);
    else ((float *)p)[i] = f;
}
#endif
