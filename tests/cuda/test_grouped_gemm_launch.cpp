// The portable grouped GEMM (src/cuda/grouped_gemm.h) as a launch: captured in a CUDA graph and
// replayed with new inputs, grouped_gemm_can_implement / grouped_gemm explaining each bad
// argument, no launch for no rows, and the tile heuristic. The harness:
// grouped_gemm_test_util.h.
#include <cuda_runtime.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cuda/cuda_check.h"
#include "cuda/gpu_test.h"
#include "cuda/grouped_gemm.h"
#include "cuda/grouped_gemm_heuristic.cuh"
#include "cuda/grouped_gemm_test_util.h"
#include "modmoe/activation.h"
#include "modmoe/dtype.h"
#include "modmoe/error.h"
#include "modmoe/quant.h"

namespace modmoe::cuda::grouped_gemm_test {
namespace {

using ::testing::HasSubstr;

// ---- graph capture ---------------------------------------------------------------------------

TEST(CudaGroupedGemm, CapturedInAGraphAndReplayedWithNewInputs) {
  MODMOE_REQUIRE_GPU();
  Case c;
  c.name = "graph";
  c.ab = DType::fp8_e4m3;
  c.scheme = QuantScheme::fp8_block;
  c.E = 8;
  c.N_b = 2 * 64;
  c.K = 256;
  c.rows = {5, 0, 70, 2, 9, 33, 0, 1};
  c.gated = true;
  c.seed = 800;
  HostProblem h = make_problem(c);
  DeviceProblem dp = upload(c, h);

  cudaStream_t stream;
  MODMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  MODMOE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  try {
    grouped_gemm(dp.args, stream);
  } catch (...) {
    cudaStreamEndCapture(stream, &graph);  // leave no capture behind for the other tests
    cudaGetLastError();
    throw;
  }
  MODMOE_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  MODMOE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

  for (uint32_t replay = 0; replay < 2; ++replay) {
    // New operands and routing in the same buffers (same sizes: same row total).
    Case next = c;
    next.seed = 801 + replay;
    next.rows = replay == 0 ? std::vector<int>{0, 40, 10, 20, 0, 30, 20, 0}
                            : std::vector<int>{120, 0, 0, 0, 0, 0, 0, 0};
    const HostProblem hn = make_problem(next);
    ASSERT_EQ(hn.a.size(), h.a.size());
    dp.a.upload(hn.a);
    dp.b.upload(hn.b);
    dp.a_scale.upload(hn.a_scale);
    dp.b_scale.upload(hn.b_scale);
    dp.m_indptr.upload(hn.m_indptr);
    dp.d.fill(0xff);
    MODMOE_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    MODMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    check_output(next, hn, reference(next, hn), dp.d.download());
  }
  MODMOE_CUDA_CHECK(cudaGraphExecDestroy(exec));
  MODMOE_CUDA_CHECK(cudaGraphDestroy(graph));
  MODMOE_CUDA_CHECK(cudaStreamDestroy(stream));
}

// ---- argument checks -------------------------------------------------------------------------

TEST(CudaGroupedGemm, CanImplementExplainsWhatIsWrong) {
  MODMOE_REQUIRE_GPU();
  Case c;
  c.E = 2;
  c.N_b = 64;
  c.K = 64;
  c.rows = {3, 4};
  c.gated = true;
  HostProblem h = make_problem(c);
  DeviceProblem dp = upload(c, h);
  const GroupedGemmArgs good = dp.args;
  ASSERT_EQ(grouped_gemm_can_implement(good), "");

  struct Bad {
    std::string expect;
    std::function<void(GroupedGemmArgs&)> edit;
  };
  int32_t* some_ints = dp.m_indptr.as<int32_t>();
  const std::vector<Bad> cases = {
      {"grouped_gemm: ab_dtype must be bf16, fp16 or fp8_e4m3, got fp32",
       [](GroupedGemmArgs& a) { a.ab_dtype = DType::fp32; }},
      {"grouped_gemm: E must be in [1, 1024]", [](GroupedGemmArgs& a) { a.E = 0; }},
      {"grouped_gemm: N_b must be even and >= 2 in gated mode",
       [](GroupedGemmArgs& a) { a.N_b = 63; }},
      {"grouped_gemm: K must be a positive multiple of 8 for bf16 (A and B rows are copied in "
       "16-byte pieces), got K = 60",
       [](GroupedGemmArgs& a) {
         a.K = 60;
         a.lda = 64;
       }},
      {"grouped_gemm: K must be a positive multiple of 16 for fp8_e4m3",
       [](GroupedGemmArgs& a) {
         a.ab_dtype = DType::fp8_e4m3;
         a.scheme = QuantScheme::fp8_tensor;
         a.a_scale = a.b_scale = a.A;
         a.K = 56;
       }},
      {"grouped_gemm: lda must be >= K = 64 and a multiple of 8 for bf16",
       [](GroupedGemmArgs& a) { a.lda = 60; }},
      {"grouped_gemm: lda must be >= K = 64", [](GroupedGemmArgs& a) { a.lda = 68; }},
      {"grouped_gemm: A and B must be 16-byte aligned",
       [](GroupedGemmArgs& a) { a.A = static_cast<const char*>(a.A) + 2; }},
      {"grouped_gemm: exactly one of m_indptr (standard) and expert_num_tokens (batched) must "
       "be given, got both",
       [&](GroupedGemmArgs& a) {
         a.expert_num_tokens = some_ints;
         a.batch_rows = 4;
       }},
      {"got neither", [](GroupedGemmArgs& a) { a.m_indptr = nullptr; }},
      {"grouped_gemm: batch_rows must be >= 0",
       [&](GroupedGemmArgs& a) {
         a.m_indptr = nullptr;
         a.expert_num_tokens = some_ints;
         a.batch_rows = -1;
       }},
      {"grouped_gemm: max_rows must be in [0, 2^31), got -3",
       [](GroupedGemmArgs& a) { a.max_rows = -3; }},
      {"grouped_gemm: scheme must be none for bf16 operands, got fp8-block",
       [](GroupedGemmArgs& a) { a.scheme = QuantScheme::fp8_block; }},
      {"grouped_gemm: scheme must be fp8-tensor, fp8-token, fp8-block or mxfp8 for fp8_e4m3",
       [](GroupedGemmArgs& a) { a.ab_dtype = DType::fp8_e4m3; }},
      {"grouped_gemm: a_scale and b_scale must be given for fp8-block, got b_scale = null",
       [](GroupedGemmArgs& a) {
         a.ab_dtype = DType::fp8_e4m3;
         a.scheme = QuantScheme::fp8_block;
         a.a_scale = a.A;
       }},
      {"grouped_gemm: activation must be a gated form (silu, gelu, gelu_tanh, swigluoai) in "
       "gated mode, got silu_no_mul",
       [](GroupedGemmArgs& a) { a.activation = Activation::silu_no_mul; }},
      {"grouped_gemm: d_dtype must be bf16, fp16 or fp32, got int32",
       [](GroupedGemmArgs& a) { a.d_dtype = DType::int32; }},
      {"grouped_gemm: ldd must be >= N_out = 32 (N_b / 2, gated), got 31",
       [](GroupedGemmArgs& a) { a.ldd = 31; }},
      {"grouped_gemm: D must be aligned to its element size (4 bytes)",
       [](GroupedGemmArgs& a) {
         a.d_dtype = DType::fp32;
         a.D = static_cast<char*>(a.D) + 2;
       }},
      {"grouped_gemm: A, B and D must be device pointers",
       [](GroupedGemmArgs& a) { a.B = nullptr; }},
  };
  for (const Bad& bad : cases) {
    GroupedGemmArgs a = good;
    bad.edit(a);
    EXPECT_THAT(grouped_gemm_can_implement(a), HasSubstr(bad.expect));
    try {
      grouped_gemm(a, nullptr);
      ADD_FAILURE() << "grouped_gemm accepted arguments that should fail with: " << bad.expect;
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr(bad.expect));
    }
  }
}

// Rows that cannot exist launch nothing: D keeps its poison.
TEST(CudaGroupedGemm, NoRowsNoLaunch) {
  MODMOE_REQUIRE_GPU();
  Case c;
  c.E = 2;
  c.N_b = 64;
  c.K = 64;
  c.rows = {0, 0};
  c.max_rows = 0;
  HostProblem h = make_problem(c);
  DeviceProblem dp = upload(c, h);
  dp.d.fill(0xff);
  grouped_gemm(dp.args, nullptr);
  MODMOE_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint8_t> d = dp.d.download();
  EXPECT_TRUE(std::all_of(d.begin(), d.end(), [](uint8_t v) { return v == 0xff; }));
}

TEST(CudaGroupedGemm, TileHeuristic) {
  MODMOE_REQUIRE_GPU();
  using gemm::choose_gemm_tile;
  using gemm::GemmTile;
  // Decode: a token's top-k rows land on distinct experts.
  EXPECT_EQ(choose_gemm_tile(1 * 8, 256, false, 0), GemmTile::k16x64);
  EXPECT_EQ(choose_gemm_tile(128 * 8, 128, false, 0), GemmTile::k16x64);  // 8 rows / expert
  EXPECT_EQ(choose_gemm_tile(16 * 2, 8, false, 0), GemmTile::k16x64);
  // Prefill.
  EXPECT_EQ(choose_gemm_tile(1024 * 8, 128, false, 0), GemmTile::k64x128);  // 64 rows / expert
  EXPECT_EQ(choose_gemm_tile(8192 * 2, 8, false, 0), GemmTile::k64x128);
  // Batched: no expert has more than batch_rows.
  EXPECT_EQ(choose_gemm_tile(0, 8, true, 16), GemmTile::k16x64);
  EXPECT_EQ(choose_gemm_tile(0, 8, true, 512), GemmTile::k64x128);
  EXPECT_EQ(choose_gemm_tile(8 * 512, 8, true, 24), GemmTile::k16x64);
}

}  // namespace
}  // namespace modmoe::cuda::grouped_gemm_test
