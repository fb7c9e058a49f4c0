// moe_gemm_groupwise on CUDA against the CPU backend (same contract, src/moe_gemm.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_session.h"
#include "cuda/gpu_test.h"
#include "modmoe/modmoe.h"
#include "modmoe/numeric.h"

namespace modmoe {
namespace {

TEST(CudaMoeGemm, MatchesTheCpuBackend) {
  MODMOE_REQUIRE_GPU();
  testing::CudaSession gpu;
  for (DType dtype : {DType::bf16, DType::fp8_e4m3}) {
    for (bool gated : {false, true}) {
      const int64_t E = 8, N_b = 256, K = 512, rows = 40;
      const std::vector<int32_t> indptr = {0, 5, 5, 12, 20, 20, 33, 38, 40};
      std::mt19937 rng(11);
      std::normal_distribution<float> n(0.f, 1.f);
      OwnedTensor a32 = host_tensor(DType::fp32, {rows, K}),
                  b32 = host_tensor(DType::fp32, {E, N_b, K});
      for (int64_t i = 0; i < a32.tensor().numel(); ++i) a32.data_ptr<float>()[i] = n(rng);
      for (int64_t i = 0; i < b32.tensor().numel(); ++i) b32.data_ptr<float>()[i] = n(rng) / 20.f;
      OwnedTensor a, b, as, bs;
      if (dtype == DType::fp8_e4m3) {
        a = host_tensor(dtype, {rows, K});
        b = host_tensor(dtype, {E, N_b, K});
        as = host_tensor(DType::fp32, act_scale_shape(QuantScheme::fp8_block, rows, K));
        bs = host_tensor(DType::fp32, weight_scale_shape(QuantScheme::fp8_block, E, N_b, K));
        quantize_activations(Context::cpu(), a32, QuantScheme::fp8_block, false, a, as);
        quantize_weights(Context::cpu(), b32, QuantScheme::fp8_block, b, bs);
      } else {
        a = host_tensor(dtype, {rows, K});
        b = host_tensor(dtype, {E, N_b, K});
        for (int64_t i = 0; i < a32.tensor().numel(); ++i)
          store_float(a.tensor().data(), dtype, i, a32.data_ptr<float>()[i]);
        for (int64_t i = 0; i < b32.tensor().numel(); ++i)
          store_float(b.tensor().data(), dtype, i, b32.data_ptr<float>()[i]);
      }
      OwnedTensor m = host_tensor(DType::int32, {E + 1});
      for (int64_t e = 0; e <= E; ++e) m.data_ptr<int32_t>()[e] = indptr[e];
      const int64_t N_out = gated ? N_b / 2 : N_b;
      OwnedTensor out_cpu = host_tensor(DType::fp32, {rows, N_out});
      MoeGemmOptions o;
      o.gated = gated;
      moe_gemm_groupwise(Context::cpu(), a, b, as, bs, m, out_cpu, o);

      auto dev = [&](const Tensor& t) { return t.defined() ? gpu.to_device(t) : OwnedTensor(); };
      OwnedTensor da = dev(a), db = dev(b), das = dev(as), dbs = dev(bs), dm = dev(m);
      OwnedTensor dout = gpu.to_device(out_cpu);  // any content: every row is owned here
      moe_gemm_groupwise(gpu.ctx(), da, db, das, dbs, dm, dout, o);
      OwnedTensor out_gpu = gpu.to_host(dout);
      double num = 0, den = 0;
      for (int64_t i = 0; i < rows * N_out; ++i) {
        const double d = out_gpu.data_ptr<float>()[i] - out_cpu.data_ptr<float>()[i];
        num += d * d;
        den += double(out_cpu.data_ptr<float>()[i]) * out_cpu.data_ptr<float>()[i];
        ASSERT_TRUE(std::isfinite(out_gpu.data_ptr<float>()[i])) << i;
      }
      EXPECT_LT(std::sqrt(num / den), 1e-3) << dtype_name(dtype) << (gated ? " gated" : " plain");
    }
  }
}

// MX-FP8 (e4m3 with e8m0 scales per 32 along K): the portable kernel, and whatever automatic
// picks (the portable kernel wherever the Hopper kernel does not take MX scales), against the
// CPU backend on the same inputs. Rows 0-2 and 45-46 belong to no expert and must stay NaN.
TEST(CudaMoeGemm, MxFp8MatchesTheCpuBackend) {
  MODMOE_REQUIRE_GPU();
  testing::CudaSession gpu;
  // K = 480: 15 scale groups, no multiple of 128; experts 1, 4 and 7 are empty.
  const int64_t E = 8, N_b = 256, K = 480, rows = 47;
  const std::vector<int32_t> indptr = {3, 8, 8, 15, 23, 23, 36, 45, 45};
  std::mt19937 rng(23);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_int_distribution<int> a_exponent(120, 134), b_exponent(110, 122);
  OwnedTensor a = host_tensor(DType::fp8_e4m3, {rows, K});
  OwnedTensor b = host_tensor(DType::fp8_e4m3, {E, N_b, K});
  OwnedTensor as = host_tensor(DType::e8m0, {rows, K / 32});
  OwnedTensor bs = host_tensor(DType::e8m0, {E, N_b, K / 32});
  for (const Tensor& t : {a.tensor(), b.tensor()})
    for (int64_t i = 0; i < t.numel(); ++i)
      static_cast<uint8_t*>(t.data())[i] = float_to_e4m3(normal(rng));
  for (int64_t i = 0; i < as.tensor().numel(); ++i)
    as.data_ptr<uint8_t>()[i] = static_cast<uint8_t>(a_exponent(rng));
  for (int64_t i = 0; i < bs.tensor().numel(); ++i)
    bs.data_ptr<uint8_t>()[i] = static_cast<uint8_t>(b_exponent(rng));
  OwnedTensor m = host_tensor(DType::int32, {E + 1});
  for (int64_t e = 0; e <= E; ++e) m.data_ptr<int32_t>()[e] = indptr[e];
  OwnedTensor da = gpu.to_device(a), db = gpu.to_device(b), das = gpu.to_device(as),
              dbs = gpu.to_device(bs), dm = gpu.to_device(m);

  for (bool gated : {false, true}) {
    for (MoeGemmKernel kernel : {MoeGemmKernel::portable, MoeGemmKernel::automatic}) {
      const std::string what = std::string(gated ? "gated" : "plain") +
                               (kernel == MoeGemmKernel::portable ? " portable" : " automatic");
      const int64_t N_out = gated ? N_b / 2 : N_b;
      MoeGemmOptions o;
      o.gated = gated;
      o.gated_layout = GatedLayout::UpGate;
      OwnedTensor poison = host_tensor(DType::fp32, {rows, N_out});
      for (int64_t i = 0; i < rows * N_out; ++i) poison.data_ptr<float>()[i] = NAN;
      OwnedTensor out_cpu = host_tensor(DType::fp32, {rows, N_out});
      std::memcpy(out_cpu.tensor().data(), poison.tensor().data(), poison.tensor().nbytes());
      moe_gemm_groupwise(Context::cpu(), a, b, as, bs, m, out_cpu, o);

      o.kernel = kernel;
      OwnedTensor dout = gpu.to_device(poison);
      moe_gemm_groupwise(gpu.ctx(), da, db, das, dbs, dm, dout, o);
      OwnedTensor out_gpu = gpu.to_host(dout);

      // Per expert, so one wrong expert cannot hide in the average.
      for (int64_t e = 0; e < E; ++e) {
        double num = 0, den = 0;
        for (int64_t i = indptr[e] * N_out; i < indptr[e + 1] * N_out; ++i) {
          const double got = out_gpu.data_ptr<float>()[i], want = out_cpu.data_ptr<float>()[i];
          ASSERT_TRUE(std::isfinite(got)) << what << " element " << i;
          num += (got - want) * (got - want);
          den += want * want;
        }
        if (indptr[e + 1] > indptr[e]) {
          EXPECT_LT(std::sqrt(num / den), 1e-3) << what << " expert " << e;
        }
      }
      for (int64_t r : {0, 1, 2, 45, 46})
        for (int64_t j = 0; j < N_out; ++j)
          ASSERT_TRUE(std::isnan(out_gpu.data_ptr<float>()[r * N_out + j]))
              << what << " unowned row " << r << " col " << j;
    }
  }
}

}  // namespace
}  // namespace modmoe
