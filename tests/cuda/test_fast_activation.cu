// The Hopper gated epilogue's fast act(gate) * up (gated_function<true>, activation_device.cuh:
// x sigmoid(a x) through one tanh.approx) against the float64 formula of modmoe/activation.h.
// Its error contract: at most 2e-5 of |g| |u| (g the gate after swigluoai's clamp, u the up
// factor), a hundredth of the bf16 rounding of the product (2^-9); measured on the H200 at most
// 4.2e-6 (perf.md, twenty-ninth session). The GEMM tests see the same only through bf16 and
// fp8 outs and their tolerances.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cuda/activation_device.cuh"
#include "cuda/cuda_session.h"
#include "cuda/gpu_test.h"
#include "modmoe/activation.h"

namespace modmoe {
namespace {

__global__ void fast_gated_kernel(Activation act, const float* gate, const float* up, float* out,
                                  int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = cuda::gated_function<true>(act, gate[i], up[i]);
}

// gated_function<true>(act, gate[i], up[i]) on the device, into a NaN-poisoned out.
std::vector<float> run_fast(const testing::CudaSession& gpu, Activation act,
                            const std::vector<float>& gate, const std::vector<float>& up) {
  const int64_t n = static_cast<int64_t>(gate.size());
  OwnedTensor gate_h = host_tensor(DType::fp32, {n}), up_h = host_tensor(DType::fp32, {n});
  std::copy(gate.begin(), gate.end(), gate_h.data_ptr<float>());
  std::copy(up.begin(), up.end(), up_h.data_ptr<float>());
  const OwnedTensor gate_d = gpu.to_device(gate_h), up_d = gpu.to_device(up_h);
  const OwnedTensor out_d = gpu.empty(DType::fp32, {n});
  EXPECT_EQ(cudaMemsetAsync(out_d.tensor().data(), 0xFF, n * sizeof(float), gpu.stream()),
            cudaSuccess);
  fast_gated_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, gpu.stream()>>>(
      act, gate_d.data_ptr<float>(), up_d.data_ptr<float>(), out_d.data_ptr<float>(),
      static_cast<int>(n));
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  const OwnedTensor out_h = gpu.to_host(out_d.tensor());
  return std::vector<float>(out_h.data_ptr<float>(), out_h.data_ptr<float>() + n);
}

TEST(CudaFastActivation, SigmoidFormsStayWithinTheirErrorBound) {
  MODMOE_REQUIRE_GPU();
  testing::CudaSession gpu;
  // Gates over [-24, 24] (every 2^-10; past swigluoai's clamp of 7), ups of both signs.
  std::vector<float> gate, up;
  for (int i = -24 * 1024; i <= 24 * 1024; ++i) {
    gate.push_back(static_cast<float>(i) / 1024.0f);
    up.push_back(i % 3 == 0 ? 1.0f : (i % 3 == 1 ? -2.5f : 9.0f));
  }
  for (Activation act : {Activation::silu, Activation::swigluoai}) {
    SCOPED_TRACE(activation_name(act));
    const std::vector<float> got = run_fast(gpu, act, gate, up);
    double worst = 0.0;
    for (size_t i = 0; i < gate.size(); ++i) {
      const double g = gate[i], u = up[i];
      const double exact = activation_gated<double>(act, g, u);
      // The product's scale: |g| |u| with swigluoai's clamp of g and its (clamp(u) + 1).
      const double g_used = act == Activation::swigluoai ? std::min(g, double(kSwigluOaiLimit)) : g;
      const double u_used =
          act == Activation::swigluoai
              ? std::max(std::min(u, double(kSwigluOaiLimit)), -double(kSwigluOaiLimit)) + 1.0
              : u;
      const double scale = std::fabs(g_used * u_used);
      ASSERT_TRUE(std::isfinite(got[i])) << "gate " << g << " up " << u;
      const double err = std::fabs(got[i] - exact);
      if (scale > 0) worst = std::max(worst, err / scale);
      ASSERT_LE(err, 2e-5 * scale + 1e-37) << "gate " << g << " up " << u << ": " << got[i]
                                           << " against " << exact;
    }
    RecordProperty(std::string("worst_error_over_gate_up_") + activation_name(act),
                   std::to_string(worst));
  }
}

TEST(CudaFastActivation, SpecialValuesAsTheExactFormula) {
  MODMOE_REQUIRE_GPU();
  testing::CudaSession gpu;
  const float inf = std::numeric_limits<float>::infinity(),
              nan = std::numeric_limits<float>::quiet_NaN();
  // gate, up: exact zeros give 0 (no slow path, no NaN); -inf gives NaN as -inf * sigmoid(-inf)
  // = -inf * 0 does; +inf gives inf; a NaN gate gives NaN.
  const std::vector<float> gate = {0.0f, 0.0f, -0.0f, -inf, inf, nan, -100.0f};
  const std::vector<float> up = {0.0f, 3.0f, 0.0f, 1.0f, 1.0f, 1.0f, 1.0f};
  const std::vector<float> got = run_fast(gpu, Activation::silu, gate, up);
  EXPECT_EQ(got[0], 0.0f);
  EXPECT_EQ(got[1], 0.0f);
  EXPECT_EQ(got[2], 0.0f);
  EXPECT_TRUE(std::isnan(got[3])) << got[3];
  EXPECT_EQ(got[4], inf);
  EXPECT_TRUE(std::isnan(got[5])) << got[5];
  EXPECT_LE(std::fabs(got[6]), 2e-5 * 100.0);  // -100 sigmoid(-100) = -3.7e-42
  for (size_t i = 0; i < gate.size(); ++i) {
    const double exact = activation_gated<double>(Activation::silu, gate[i], up[i]);
    EXPECT_EQ(std::isnan(exact), std::isnan(got[i])) << "gate " << gate[i] << " up " << up[i];
  }
}

}  // namespace
}  // namespace modmoe
