// The portable grouped GEMM (src/cuda/grouped_gemm.h) over row ownership: empty experts, one
// expert with every row, 1 and 256 experts, a grid smaller than the work, experts taller than a
// raster band, batched rows past the counts, and rows gathered through a_row_index. How a case is
// drawn and checked (unowned rows are NaN, D keeps its poison outside them):
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

// ---- row ownership -----------------------------------------------------------------------------

TEST(CudaGroupedGemm, EmptyExpertsAndOneExpertWithAllRows) {
  MODMOE_REQUIRE_GPU();
  Case c;
  c.name = "one expert owns every row";
  c.E = 8;
  c.N_b = 128;
  c.K = 64;
  c.rows = {0, 0, 0, 0, 0, 150, 0, 0};
  c.seed = 400;
  run_case(c);

  c.name = "every expert empty";
  c.rows.assign(8, 0);
  c.max_rows = 40;  // the grid is sized for rows that do not come
  c.seed = 401;
  run_case(c);

  c.name = "fp8 block, one expert";
  c.ab = DType::fp8_e4m3;
  c.scheme = QuantScheme::fp8_block;
  c.rows = {0, 0, 0, 0, 0, 0, 0, 77};
  c.max_rows = -1;
  c.gated = true;
  c.seed = 402;
  run_case(c);
}

TEST(CudaGroupedGemm, ExpertCounts1And256) {
  MODMOE_REQUIRE_GPU();
  Case c;
  c.name = "E=1";
  c.E = 1;
  c.N_b = 2 * 64;
  c.K = 320;
  c.rows = {300};
  c.gated = true;
  c.seed = 500;
  run_case(c);

  c.name = "E=256 decode";
  c.E = 256;
  c.N_b = 2 * 48;
  c.K = 128;
  c.rows = random_rows(501, c.E, 0, 3);
  c.layout = GatedLayout::UpGate;
  c.seed = 502;
  run_case(c);

  c.name = "E=256 fp8 mx";
  c.ab = DType::fp8_e4m3;
  c.scheme = QuantScheme::mxfp8;
  c.rows = random_rows(503, c.E, 0, 2);
  c.seed = 504;
  run_case(c);
}

TEST(CudaGroupedGemm, MaxRowsOnlySizesTheGrid) {
  MODMOE_REQUIRE_GPU();
  // A grid sized for one tile must still walk every tile (persistent loop).
  Case c;
  c.name = "max_rows = 1";
  c.E = 4;
  c.N_b = 256;
  c.K = 64;
  c.rows = {40, 3, 90, 17};
  c.max_rows = 1;
  c.seed = 550;
  run_case(c);
}

TEST(CudaGroupedGemm, ManyMTilesPerExpert) {
  MODMOE_REQUIRE_GPU();
  // Experts taller than one raster band (512 rows): the m-fastest walk wraps into a second,
  // partial band.
  Case c;
  c.name = "10 m-tiles of 64";
  c.E = 2;
  c.N_b = 192;
  c.K = 64;
  c.rows = {600, 77};
  c.seed = 560;
  ASSERT_EQ(tile_of(c), gemm::GemmTile::k64x128);
  run_case(c);

  c.name = "38 m-tiles of 16";
  c.E = 64;
  c.rows.assign(64, 0);
  c.rows[9] = 600;
  c.rows[10] = 5;
  c.gated = true;
  c.seed = 561;
  ASSERT_EQ(tile_of(c), gemm::GemmTile::k16x64);
  run_case(c);
}

TEST(CudaGroupedGemm, BatchedGarbageRowsDoNotLeak) {
  MODMOE_REQUIRE_GPU();
  Case c;
  c.name = "batched bf16 gated";
  c.batched = true;
  c.E = 4;
  c.batch_rows = 40;
  c.rows = {0, 40, 17, 5};  // rows past the counts hold NaN in A and must stay NaN in D
  c.N_b = 2 * 80;
  c.K = 192;
  c.gated = true;
  c.seed = 600;
  run_case(c);

  c.name = "batched fp8 block plain";
  c.ab = DType::fp8_e4m3;
  c.scheme = QuantScheme::fp8_block;
  c.gated = false;
  c.N_b = 136;
  c.K = 272;
  c.batch_rows = 100;
  c.rows = {99, 0, 64, 100};
  c.max_rows = 263;  // given: the total of the counts
  c.seed = 601;
  run_case(c);

  c.name = "batched fp8 mx decode";
  c.scheme = QuantScheme::mxfp8;
  c.batch_rows = 8;
  c.rows = {1, 0, 8, 3};
  c.max_rows = -1;
  c.seed = 602;
  ASSERT_EQ(tile_of(c), gemm::GemmTile::k16x64);
  run_case(c);
}

TEST(CudaGroupedGemm, GatherThroughRowIndex) {
  MODMOE_REQUIRE_GPU();
  uint32_t seed = 700;
  for (QuantScheme scheme :
       {QuantScheme::none, QuantScheme::fp8_token, QuantScheme::fp8_block, QuantScheme::mxfp8}) {
    for (bool decode : {false, true}) {
      Case c;
      c.name = "gather";
      c.ab = scheme == QuantScheme::none ? DType::bf16 : DType::fp8_e4m3;
      c.scheme = scheme;
      c.E = 5;
      c.N_b = 2 * 72;
      c.K = 384;
      c.rows = decode ? std::vector<int>{3, 1, 0, 2, 4} : std::vector<int>{40, 81, 0, 66, 7};
      c.gather = true;  // unowned A rows (and their scales) are NaN
      c.gated = true;
      c.layout = GatedLayout::Interleaved;
      c.lda_pad = 16;
      c.seed = seed++;
      run_case(c);
    }
  }
}

}  // namespace
}  // namespace modmoe::cuda::grouped_gemm_test
