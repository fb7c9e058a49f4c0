// The portable grouped GEMM (src/cuda/grouped_gemm.h) over its operand types: bf16 and fp16
// operands, plain and gated (every layout and activation), and e4m3 operands with each fp8
// scheme, on both tiles, against a float64 reference. How a case is drawn and checked:
// grouped_gemm_test_util.h.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda/gpu_test.h"
#include "cuda/grouped_gemm_heuristic.cuh"
#include "cuda/grouped_gemm_test_util.h"
#include "modmoe/activation.h"
#include "modmoe/dtype.h"
#include "modmoe/quant.h"

namespace modmoe::cuda::grouped_gemm_test {
namespace {

// ---- 16-bit operands ---------------------------------------------------------------------

TEST(CudaGroupedGemm, Bf16PlainPrefillTile) {
  MODMOE_REQUIRE_GPU();
  Case c;
  c.name = "bf16 plain prefill";
  c.E = 8;
  c.N_b = 200;                              // not a multiple of the 128-wide tile
  c.K = 200;                                // 400 bytes: 3 full slices and a 16-byte one
  c.rows = {0, 1, 17, 64, 100, 3, 0, 130};  // not multiples of 64, empty experts
  c.lda_pad = 24;
  c.ldd_pad = 8;
  c.seed = 101;
  ASSERT_EQ(tile_of(c), gemm::GemmTile::k64x128);
  run_case(c);
}

TEST(CudaGroupedGemm, Bf16PlainDecodeTile) {
  MODMOE_REQUIRE_GPU();
  Case c;
  c.name = "bf16 plain decode";
  c.E = 64;
  c.N_b = 96;
  c.K = 512;
  c.rows = random_rows(7, c.E, 0, 3);
  c.d_dtype = DType::fp32;
  c.seed = 102;
  ASSERT_EQ(tile_of(c), gemm::GemmTile::k16x64);
  run_case(c);
}

TEST(CudaGroupedGemm, Fp16PlainOutputs) {
  MODMOE_REQUIRE_GPU();
  for (DType d : {DType::fp16, DType::fp32, DType::bf16}) {
    Case c;
    c.name = "fp16 plain";
    c.ab = DType::fp16;
    c.E = 4;
    c.N_b = 136;
    c.K = 264;
    c.rows = {50, 33, 0, 81};
    c.d_dtype = d;
    c.ldd_pad = 3;  // odd: rows not 16-byte aligned, the scalar store path
    c.seed = 103;
    run_case(c);
    c.rows = {1, 9, 0, 2};  // the decode tile
    c.seed = 104;
    run_case(c);
  }
}

TEST(CudaGroupedGemm, Bf16GatedLayoutsAndActivations) {
  MODMOE_REQUIRE_GPU();
  uint32_t seed = 200;
  for (GatedLayout layout : {GatedLayout::GateUp, GatedLayout::UpGate, GatedLayout::Interleaved}) {
    for (Activation act : {Activation::silu, Activation::swigluoai}) {
      for (bool decode : {false, true}) {
        Case c;
        c.name = "bf16 gated";
        c.E = 6;
        c.N_b = 2 * 72;  // N_out = 72: not a multiple of either tile's output width
        c.K = 256;       // dot products of order +-10: swigluoai's clamps at +-7 are hit
        c.rows =
            decode ? std::vector<int>{2, 0, 5, 1, 3, 1} : std::vector<int>{70, 0, 45, 128, 3, 66};
        c.gated = true;
        c.activation = act;
        c.layout = layout;
        c.seed = seed++;
        ASSERT_EQ(tile_of(c), decode ? gemm::GemmTile::k16x64 : gemm::GemmTile::k64x128);
        run_case(c);
      }
    }
  }
  for (Activation act : {Activation::gelu, Activation::gelu_tanh}) {
    Case c;
    c.name = "bf16 gated gelu";
    c.E = 3;
    c.N_b = 2 * 40;
    c.K = 128;
    c.rows = {37, 80, 12};
    c.gated = true;
    c.activation = act;
    c.d_dtype = DType::fp32;
    c.seed = seed++;
    run_case(c);
  }
}

// ---- fp8 --------------------------------------------------------------------------------------

const QuantScheme kFp8Schemes[] = {QuantScheme::fp8_tensor, QuantScheme::fp8_token,
                                   QuantScheme::fp8_block, QuantScheme::mxfp8};

TEST(CudaGroupedGemm, Fp8SchemesPrefillK2880) {
  MODMOE_REQUIRE_GPU();
  uint32_t seed = 300;
  for (QuantScheme scheme : kFp8Schemes) {
    for (bool gated : {false, true}) {
      Case c;
      c.name = "fp8 prefill K=2880";
      c.ab = DType::fp8_e4m3;
      c.scheme = scheme;
      c.E = 4;
      c.N_b = gated ? 2 * 96 : 160;  // gated GateUp: up rows 96.. straddle a 128-row block
      c.K = 2880;                    // 22.5 blocks of 128, 90 groups of 32
      c.rows = {70, 0, 33, 96};
      c.gated = gated;
      c.layout = GatedLayout::GateUp;
      c.d_dtype = gated ? DType::bf16 : DType::fp32;
      c.seed = seed++;
      ASSERT_EQ(tile_of(c), gemm::GemmTile::k64x128);
      run_case(c);
    }
  }
}

TEST(CudaGroupedGemm, Fp8SchemesDecodePartialBlocks) {
  MODMOE_REQUIRE_GPU();
  uint32_t seed = 320;
  for (QuantScheme scheme : kFp8Schemes) {
    for (bool gated : {false, true}) {
      Case c;
      c.name = "fp8 decode K=208";
      c.ab = DType::fp8_e4m3;
      c.scheme = scheme;
      c.E = 16;
      c.N_b = gated ? 2 * 136 : 200;  // past one 128-row block of B scales
      c.K = 208;                      // a partial 128 block (80) and a partial 32 group (16)
      c.rows = random_rows(seed, c.E, 0, 4);
      c.gated = gated;
      c.activation = Activation::swigluoai;
      c.layout = GatedLayout::Interleaved;
      c.d_dtype = DType::fp32;
      c.seed = seed++;
      ASSERT_EQ(tile_of(c), gemm::GemmTile::k16x64);
      run_case(c);
    }
  }
}

}  // namespace
}  // namespace modmoe::cuda::grouped_gemm_test
