// The Hopper grouped GEMM launched programmatically (sm90::GemmArgs::programmatic) after a kernel
// that writes the GEMM's rows, row scales and out late (late_writer.cuh): the GEMM may start
// while that kernel runs and request its weight stages, but must read a (and fp8 a_scale) and
// write d only after its griddepcontrol.wait. The rows are poisoned until then (bf16 0x7f7f ~
// 3.4e38, whose products overflow; fp8 codes 0x7e = 448 with NaN scales): the GEMM's out must be
// finite and match the reference.
//
// It fails with the producer's wait removed (…-s32-patches/mutation-producer-no-wait.patch,
// 2026-12-04: non-finite -inf at row 0, docs/perf.md thirty-third session) once the GEMM has been
// launched normally first (late_writer.cuh says why).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/cuda_session.h"
#include "cuda/gpu_test.h"
#include "cuda/late_writer.cuh"
#include "cuda/programmatic_launch.cuh"
#include "cuda/sm90/sm90_gemm.h"
#include "cuda/sm90_test_util.h"
#include "modmoe/modmoe.h"
#include "modmoe/numeric.h"

namespace modmoe {
namespace {

using testing::CudaSession;
using testing::LateWrites;
using testing::sm90::indptr_from_counts;
using testing::sm90::Uniform;
namespace sm90 = cuda::sm90;

constexpr int64_t kK = 512, kN = 256;
// Experts of 170, 1, 0 and 129 rows: row tiles of 64 and 128 rows, partial ones, an empty one.
const std::vector<int32_t> kIndptr = indptr_from_counts({170, 1, 0, 129});

// out[r, n] = sum_k a[r, k] b[e, n, k] in double, from the operands' values as floats.
std::vector<double> reference(const std::vector<float>& a, const std::vector<float>& b) {
  const int64_t rows = kIndptr.back();
  std::vector<double> out(rows * kN, 0.0);
  for (size_t e = 0; e + 1 < kIndptr.size(); ++e)
    for (int64_t r = kIndptr[e]; r < kIndptr[e + 1]; ++r)
      for (int64_t n = 0; n < kN; ++n) {
        double s = 0;
        for (int64_t k = 0; k < kK; ++k)
          s += double(a[r * kK + k]) * double(b[(e * kN + n) * kK + k]);
        out[r * kN + n] = s;
      }
  return out;
}

TEST(Sm90Programmatic, GemmAfterALateWriterMatchesTheReference) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  MODMOE_REQUIRE_SM90(gpu);
  if (!cuda::programmatic_launch_available())
    GTEST_SKIP() << "programmatic launches are off (MODMOE_PDL=0) or need sm_90";
  const int64_t E = static_cast<int64_t>(kIndptr.size()) - 1, rows = kIndptr.back();
  const QuantScheme q = QuantScheme::fp8_block;
  for (DType dtype : {DType::bf16, DType::fp8_e4m3}) {
    for (const std::string tile : {"128x256", "64x256", "64x128"}) {
      const std::string what = std::string(dtype_name(dtype)) + " tile " + tile;
      Uniform u(77 + (dtype == DType::bf16));
      OwnedTensor a32 = host_tensor(DType::fp32, {rows, kK}),
                  b32 = host_tensor(DType::fp32, {E, kN, kK});
      for (int64_t i = 0; i < a32.tensor().numel(); ++i) a32.data_ptr<float>()[i] = u();
      for (int64_t i = 0; i < b32.tensor().numel(); ++i) b32.data_ptr<float>()[i] = u() / 16.0f;
      OwnedTensor a = host_tensor(dtype, {rows, kK}), b = host_tensor(dtype, {E, kN, kK});
      OwnedTensor a_scale, b_scale;
      if (dtype == DType::fp8_e4m3) {
        a_scale = host_tensor(DType::fp32, act_scale_shape(q, rows, kK));
        b_scale = host_tensor(DType::fp32, weight_scale_shape(q, E, kN, kK));
        quantize_activations(Context::cpu(), a32, q, false, a, a_scale);
        quantize_weights(Context::cpu(), b32, q, b, b_scale);
        dequantize_activations(Context::cpu(), a, a_scale, q, a32);
        dequantize_weights(Context::cpu(), b, b_scale, q, b32);
      } else {
        for (auto [t, f] : {std::pair{&a, &a32}, std::pair{&b, &b32}}) {
          for (int64_t i = 0; i < t->tensor().numel(); ++i) {
            store_float(t->tensor().data(), dtype, i, f->data_ptr<float>()[i]);
            f->data_ptr<float>()[i] = load_float(t->tensor().data(), dtype, i);
          }
        }
      }
      const std::vector<double> ref =
          reference(std::vector<float>(a32.data_ptr<float>(),
                                       a32.data_ptr<float>() + a32.tensor().numel()),
                    std::vector<float>(b32.data_ptr<float>(),
                                       b32.data_ptr<float>() + b32.tensor().numel()));

      const cudaStream_t stream = gpu.stream();
      const OwnedTensor a_real = gpu.to_device(a), b_dev = gpu.to_device(b);
      const OwnedTensor a_dev = gpu.empty(dtype, {rows, kK});
      OwnedTensor indptr = host_tensor(DType::int32, {E + 1});
      std::copy(kIndptr.begin(), kIndptr.end(), indptr.data_ptr<int32_t>());
      const OwnedTensor m_indptr = gpu.to_device(indptr);
      const OwnedTensor out = gpu.empty(DType::fp32, {rows, kN});
      ASSERT_EQ(cudaMemsetAsync(a_dev.tensor().data(), dtype == DType::bf16 ? 0x7f : 0x7e,
                                a_dev.tensor().nbytes(), stream),
                cudaSuccess);
      ASSERT_EQ(cudaMemsetAsync(out.tensor().data(), 0, out.tensor().nbytes(), stream),
                cudaSuccess);
      LateWrites w;
      w.copies[0] = testing::late_copy(a_real, a_dev);
      w.nan_fill = static_cast<uint32_t*>(out.tensor().data());
      w.nan_words = static_cast<int64_t>(out.tensor().nbytes() / 4);
      OwnedTensor scale_real, scale_dev, b_scale_dev;
      if (dtype == DType::fp8_e4m3) {
        scale_real = gpu.to_device(a_scale);
        b_scale_dev = gpu.to_device(b_scale);
        scale_dev = gpu.empty(DType::fp32, a_scale.tensor().shape());
        ASSERT_EQ(
            cudaMemsetAsync(scale_dev.tensor().data(), 0xFF, scale_dev.tensor().nbytes(), stream),
            cudaSuccess);  // NaN
        w.copies[1] = testing::late_copy(scale_real, scale_dev);
      }
      sm90::GemmArgs g;
      g.a = a_dev.tensor().data();
      g.total_rows = rows;
      g.b = b_dev.tensor().data();
      g.E = E;
      g.N_b = kN;
      g.K = kK;
      g.ab_dtype = dtype;
      g.m_indptr = m_indptr.data_ptr<int32_t>();
      if (dtype == DType::fp8_e4m3) {
        g.a_scale = scale_dev.data_ptr<float>();
        g.b_scale = b_scale_dev.data_ptr<float>();
      }
      g.d = out.tensor().data();
      g.d_dtype = DType::fp32;
      g.tile = tile;
      g.sm_count = gpu.ctx().sm_count;
      // Launched normally once first, and waited for (lazy loading: late_writer.cuh).
      ASSERT_EQ(testing::error_of([&] { sm90::launch(g, stream); }), "") << what;
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      ASSERT_EQ(testing::launch_late_writes(w, stream), cudaSuccess);

      g.programmatic = true;
      ASSERT_EQ(testing::error_of([&] { sm90::launch(g, stream); }), "") << what;
      const OwnedTensor got = gpu.to_host(out);

      double num = 0, den = 0;
      for (int64_t i = 0; i < rows * kN; ++i) {
        const double x = got.data_ptr<float>()[i];
        ASSERT_TRUE(std::isfinite(x)) << what << ": non-finite " << x << " at row " << i / kN
                                      << " col " << i % kN;
        num += (x - ref[i]) * (x - ref[i]);
        den += ref[i] * ref[i];
      }
      EXPECT_LT(std::sqrt(num / den), 1e-3) << what;
    }
  }
}

}  // namespace
}  // namespace modmoe
