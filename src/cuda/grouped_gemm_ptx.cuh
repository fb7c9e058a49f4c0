// The few PTX instructions the portable grouped GEMM is built from (sm80+; fp8 MMA sm89+):
// cp.async (16-byte, zero-filling), ldmatrix.x4 and mma.sync. Written as inline asm so the
// kernel needs no CUTLASS; each wrapper is one instruction.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace modmoe::cuda::gemm {

// The 32-bit shared-memory address of a generic pointer into shared memory.
__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronous, not cached in L1 (.cg: the tiles are streamed).
// When `valid` is false no byte is read (src-size 0) and the 16 bytes are zero-filled: that is
// how rows past an expert's end, columns past N and K past its end become zeros. `src` must
// still be a valid address then; callers pass a tensor base.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const uint32_t src_bytes = valid ? 16u : 0u;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most `pending` of this thread's committed groups are still in flight. The
// count must be an immediate, so a runtime stage count goes through this switch (the value
// is uniform across the CTA: no divergence).
__device__ __forceinline__ void cp_async_wait(int pending) {
  switch (pending) {
    case 0:
      asm volatile("cp.async.wait_group 0;\n" ::: "memory");
      break;
    case 1:
      asm volatile("cp.async.wait_group 1;\n" ::: "memory");
      break;
    case 2:
      asm volatile("cp.async.wait_group 2;\n" ::: "memory");
      break;
    case 3:
      asm volatile("cp.async.wait_group 3;\n" ::: "memory");
      break;
    case 4:
      asm volatile("cp.async.wait_group 4;\n" ::: "memory");
      break;
    default:
      asm volatile("cp.async.wait_group 5;\n" ::: "memory");
      break;
  }
}

// cp_async_wait with a compile-time count: one instruction, no switch.
template <int kPending>
__device__ __forceinline__ void cp_async_wait_pending() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Four 8x8 b16 matrices (8 rows of 16 bytes each) from shared memory; lane l gives the row
// address of row l % 8 of matrix l / 8, and receives in r[i] the 4 bytes at row l / 4,
// bytes 4 * (l % 4) .. +3 of matrix i. For 16-bit data that is the (row, 2 columns) element
// pair of the mma fragments; for fp8 the same bytes are 4 consecutive K elements, which is
// again the m16n8k32 fragment layout, so one loader serves both.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// D = A * B + C on a 16x8 fp32 tile. A: 16 x K row-major fragment (4 registers), B: K x 8
// column-major fragment (2 registers), K = 16 for bf16/fp16 and 32 for fp8 e4m3.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4],
                                               const uint32_t (&b)[2], const float (&c)[4]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
        "f"(c[2]), "f"(c[3]));
}

__device__ __forceinline__ void mma_fp16_16816(float (&d)[4], const uint32_t (&a)[4],
                                               const uint32_t (&b)[2], const float (&c)[4]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
        "f"(c[2]), "f"(c[3]));
}

__device__ __forceinline__ void mma_e4m3_16832(float (&d)[4], const uint32_t (&a)[4],
                                               const uint32_t (&b)[2], const float (&c)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
        "f"(c[2]), "f"(c[3]));
#else
  // Built for an architecture without fp8 MMA: the host never launches fp8 there.
  (void)a, (void)b, (void)c;
  d[0] = d[1] = d[2] = d[3] = 0.0f;
  __trap();
#endif
}

}  // namespace modmoe::cuda::gemm
