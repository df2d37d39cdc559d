// sm_90 building blocks of gemv_mma.cu: mbarriers, bulk copies (the copy engine: cp.async.bulk
// into shared memory, completion counted in bytes on an mbarrier), a shared-memory word, and
// one mma.sync.m16n8k16 (bf16 in, float32 sums).  Owns no arithmetic choice: the float
// operations that must match Triton's bits are triton_math.cuh's.
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

namespace {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_expect(uint32_t bar, uint32_t bytes) {
  asm volatile(
      "{\n\t.reg .b64 st;\n\t"
      "mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n\t}" ::"r"(bar),
      "r"(bytes)
      : "memory");
}

// Waits for the barrier's phase `phase` to complete.  Bounded: a copy that never lands (a bug
// in the byte counts) traps -- a launch error the caller sees -- instead of hanging the GPU;
// 2^26 polls of try_wait (each suspends a while) is seconds, far past any real copy.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t phase) {
  uint32_t done = 0;
  for (uint32_t polls = 0; !done; ++polls) {
    if (polls == (1u << 26)) __trap();
    asm volatile(
        "{\n\t.reg .pred p;\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
        "selp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(bar), "r"(phase)
        : "memory");
  }
}

__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes,
                                          uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

// A shared-memory word by an ordinary load: the compiler may schedule it ahead (the next step's
// fragments while this step's MMA runs) but not above mbar_wait, whose "memory" clobber orders it.
__device__ __forceinline__ uint32_t lds32(const unsigned char* smem, uint32_t off) {
  return *reinterpret_cast<const uint32_t*>(smem + off);
}

// A shared-memory half-word (two int8 weights), likewise an ordinary load.
__device__ __forceinline__ uint32_t lds16(const unsigned char* smem, uint32_t off) {
  return *reinterpret_cast<const uint16_t*>(smem + off);
}

__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm(   // registers only, no side effect: not volatile, so the compiler may interleave steps
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
}  // namespace
