// The fp8 codec's branch-free scale and reciprocal (fp8_codec.cuh: fp8_scale_for_amax_fast,
// fp8_reciprocal_fast), which the Hopper GEMM's fp8-out epilogue takes for every row whose
// amax allows it (fp8_scale_is_fast), against the exact forms (fp8_scale_for_amax,
// fp8_reciprocal) on every finite amax, bit for bit. Together with the CPU twins of the exact
// forms, this is what keeps the GPU's fp8 rows the CPU's bits.
#include <cstdint>
#include <cstring>

#include "cuda/cuda_session.h"
#include "cuda/fp8_codec.cuh"
#include "cuda/gpu_test.h"

namespace modmoe {
namespace {

struct CodecCheck {
  unsigned long long fast;        // amaxes on which the fast forms apply
  unsigned long long mismatches;  // of those, where a fast bit pattern differs
  unsigned int first_bad_bits;    // the smallest such amax's bits (0xffffffff: none)
};

// Every amax bit pattern in [0, inf): compares the fast forms with the exact ones.
__global__ void check_every_amax(CodecCheck* out) {
  unsigned long long fast = 0, bad = 0;
  unsigned int first_bad = 0xffffffffu;
  const uint32_t stride = gridDim.x * blockDim.x;
  for (uint32_t bits = blockIdx.x * blockDim.x + threadIdx.x; bits < 0x7f800000u; bits += stride) {
    if (!cuda::fp8_scale_is_fast(bits)) continue;
    ++fast;
    const float amax = __uint_as_float(bits);
    const float scale = cuda::fp8_scale_for_amax(amax);
    const cuda::Fp8Reciprocal exact = cuda::fp8_reciprocal(scale);
    const float fast_scale = cuda::fp8_scale_for_amax_fast(amax);
    const float fast_inverse = cuda::fp8_reciprocal_fast(fast_scale);
    if (__float_as_uint(fast_scale) != __float_as_uint(scale) || exact.pre != 1.0f ||
        __float_as_uint(fast_inverse) != __float_as_uint(exact.inverse)) {
      ++bad;
      first_bad = min(first_bad, bits);
    }
  }
  atomicAdd(&out->fast, fast);
  if (bad != 0) {
    atomicAdd(&out->mismatches, bad);
    atomicMin(&out->first_bad_bits, first_bad);
  }
}

TEST(CudaFp8Codec, FastScaleHasTheExactBitsOnEveryAmax) {
  MODMOE_REQUIRE_GPU();
  testing::CudaSession gpu;
  const OwnedTensor result = gpu.empty(DType::uint8, {static_cast<int64_t>(sizeof(CodecCheck))});
  auto* check = static_cast<CodecCheck*>(result.tensor().data());
  const CodecCheck start{0, 0, 0xffffffffu};
  ASSERT_CUDA(cudaMemcpyAsync(check, &start, sizeof start, cudaMemcpyHostToDevice, gpu.stream()));
  check_every_amax<<<1024, 256, 0, gpu.stream()>>>(check);
  ASSERT_CUDA(cudaGetLastError());
  CodecCheck got{};
  ASSERT_CUDA(cudaMemcpyAsync(&got, check, sizeof got, cudaMemcpyDeviceToHost, gpu.stream()));
  ASSERT_CUDA(cudaStreamSynchronize(gpu.stream()));
  // The predicate covers zero and every amax from 448 * 2^-126 up to the largest finite float.
  EXPECT_EQ(got.fast, 1ull + (0x7f800000ull - cuda::kFastScaleMinAmaxBits));
  float first_bad = 0.0f;
  std::memcpy(&first_bad, &got.first_bad_bits, sizeof first_bad);
  EXPECT_EQ(got.mismatches, 0ull) << "first at amax bits 0x" << std::hex << got.first_bad_bits
                                  << " (" << first_bad << ")";
}

}  // namespace
}  // namespace modmoe
