// The weighted reduce launched programmatically (WeightedReduceArgs::programmatic) after a kernel
// that writes its src rows and its out late (late_writer.cuh): the reduce may load its rows'
// indices and weights at once, but must read src and write out only after its
// griddepcontrol.wait. src is NaN until then: the out must be finite and match the reference.
//
// The bug it guards against was real: with src declared __restrict__ the compiler loaded it as
// an invariant (non-coherent) load and hoisted those loads above the wait (SASS), and a chunked
// forward's reduce read the previous chunk's y (CudaCombinations NoEP_Sm90_shape6_fp8_block_bf16,
// 2026-12-04, docs/perf.md thirty-third session).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_session.h"
#include "cuda/gpu_test.h"
#include "cuda/late_writer.cuh"
#include "cuda/programmatic_launch.cuh"
#include "cuda/reduce.h"
#include "modmoe/modmoe.h"
#include "modmoe/numeric.h"

namespace modmoe {
namespace {

using testing::CudaSession;

TEST(ProgrammaticReduce, AfterALateWriterMatchesTheReference) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  if (!cuda::programmatic_launch_available())
    GTEST_SKIP() << "programmatic launches are off (MODMOE_PDL=0) or need sm_90";
  // Decode-sized, as Sm90Experts launches it programmatically: 16 tokens of 8 pairs each.
  constexpr int64_t M = 16, topk = 8, K = 2048, P = M * topk;
  std::mt19937 rng(2026);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f), weight(0.05f, 1.0f);
  // Pairs' rows shuffled, every fifth pair skipped (-1: routed to an expert not local).
  std::vector<int32_t> pair_row(P);
  std::iota(pair_row.begin(), pair_row.end(), 0);
  std::shuffle(pair_row.begin(), pair_row.end(), rng);
  for (int64_t p = 0; p < P; p += 5) pair_row[p] = -1;
  OwnedTensor rows = host_tensor(DType::int32, {P}), weights = host_tensor(DType::fp32, {M, topk});
  std::copy(pair_row.begin(), pair_row.end(), rows.data_ptr<int32_t>());
  for (int64_t p = 0; p < P; ++p) weights.data_ptr<float>()[p] = weight(rng);

  for (DType dtype : {DType::bf16, DType::fp32}) {
    const std::string what = dtype_name(dtype);
    // src in its dtype, and the values it holds as floats for the reference.
    OwnedTensor src = host_tensor(dtype, {P, K});
    std::vector<float> src_values(P * K);
    for (int64_t i = 0; i < P * K; ++i) {
      store_float(src.tensor().data(), dtype, i, value(rng));
      src_values[i] = load_float(src.tensor().data(), dtype, i);
    }
    std::vector<double> ref(M * K, 0.0);
    for (int64_t t = 0; t < M; ++t)
      for (int64_t k = 0; k < topk; ++k) {
        const int32_t row = pair_row[t * topk + k];
        if (row < 0) continue;
        for (int64_t c = 0; c < K; ++c)
          ref[t * K + c] += double(weights.data_ptr<float>()[t * topk + k]) *
                            double(src_values[row * K + c]);
      }

    const cudaStream_t stream = gpu.stream();
    const OwnedTensor src_real = gpu.to_device(src), rows_dev = gpu.to_device(rows),
                      weights_dev = gpu.to_device(weights);
    const OwnedTensor src_dev = gpu.empty(dtype, {P, K}), out = gpu.empty(dtype, {M, K});
    ASSERT_CUDA(cudaMemsetAsync(src_dev.tensor().data(), 0xFF, src_dev.tensor().nbytes(), stream));
    cuda::WeightedReduceArgs r;
    r.src = src_dev.tensor().data();
    r.src_dtype = dtype;
    r.src_ld = K;
    r.pair_row = rows_dev.data_ptr<int32_t>();
    r.topk_weights = weights_dev.data_ptr<float>();
    r.M = M, r.topk = topk, r.K = K;
    r.out = out.tensor().data();
    r.out_dtype = dtype;
    r.out_ld = K;
    // Launched normally once first, and waited for (lazy loading: late_writer.cuh).
    ASSERT_EQ(testing::error_of([&] { cuda::weighted_reduce(r, stream); }), "") << what;
    ASSERT_CUDA(cudaStreamSynchronize(stream));

    testing::LateWrites w;
    w.copies[0] = testing::late_copy(src_real, src_dev);
    w.nan_fill = static_cast<uint32_t*>(out.tensor().data());
    w.nan_words = static_cast<int64_t>(out.tensor().nbytes() / 4);
    ASSERT_CUDA(testing::launch_late_writes(w, stream));
    r.programmatic = true;
    ASSERT_EQ(testing::error_of([&] { cuda::weighted_reduce(r, stream); }), "") << what;
    const OwnedTensor got = gpu.to_host(out);

    double num = 0, den = 0;
    for (int64_t i = 0; i < M * K; ++i) {
      const double x = load_float(got.tensor().data(), dtype, i);
      ASSERT_TRUE(std::isfinite(x)) << what << ": non-finite " << x << " at token " << i / K
                                    << " col " << i % K;
      num += (x - ref[i]) * (x - ref[i]);
      den += ref[i] * ref[i];
    }
    // fp32: the sums' rounding; bf16: the output's (2^-9 relative).
    EXPECT_LT(std::sqrt(num / den), dtype == DType::fp32 ? 1e-6 : 5e-3) << what;
  }
}

}  // namespace
}  // namespace modmoe
