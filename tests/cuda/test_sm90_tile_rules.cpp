// The Hopper kernel's host-side rules, without a GPU (they run in CI): the tile heuristic and
// what can_implement accepts or refuses for the fp8 128x256 tile. can_implement reads no memory,
// so the operands are fake, aligned, never-dereferenced addresses; sm_count is given, so no
// device is queried. Skipped in a build without the sm_90a kernels.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "cuda/sm90/sm90_gemm.h"

namespace modmoe {
namespace {

namespace sm90 = cuda::sm90;

constexpr int kSms = 132;

#define MODMOE_REQUIRE_SM90_KERNELS() \
  if (sm90::tile_names().empty()) GTEST_SKIP() << "this build has no sm_90a kernels"

template <typename T>
T* fake(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

// An fp8 gated FC1 with `rows_per_expert` rows in each of E = 256 experts (K = 2048, N = 512),
// block scales, bf16 out: what the heuristic sees, and what can_implement checks.
sm90::GemmArgs fp8_gated(int64_t rows_per_expert, GatedLayout layout) {
  sm90::GemmArgs g;
  g.E = 256;
  g.K = 2048;
  g.N_b = 1024;
  g.total_rows = g.E * rows_per_expert;
  g.ab_dtype = DType::fp8_e4m3;
  g.a = fake<const void>(0x10000);
  g.b = fake<const void>(0x20000);
  g.d = fake<void>(0x30000);
  g.m_indptr = fake<const int32_t>(0x40000);
  g.a_scale = fake<const float>(0x50000);
  g.b_scale = fake<const float>(0x60000);
  g.gated = true;
  g.gated_layout = layout;
  g.sm_count = kSms;
  return g;
}

TEST(Sm90TileRules, PrefillPicks128x256ForBf16AndFp8) {
  MODMOE_REQUIRE_SM90_KERNELS();
  for (DType dtype : {DType::bf16, DType::fp8_e4m3}) {
    // 1024 rows in each of 256 experts: many 128x256 tiles per SM.
    EXPECT_EQ(sm90::choose_tile(256 * 1024, 512, 2048, 256, true, dtype, false, kSms), "128x256")
        << dtype_name(dtype);
    // 100 rows in each of 8 experts: 8 x 4 tiles of 128x256 leave SMs idle.
    EXPECT_EQ(sm90::choose_tile(8 * 100, 512, 2048, 8, true, dtype, false, kSms), "128x128")
        << dtype_name(dtype);
    // 1 row in each of 256 experts: decode tiles.
    EXPECT_EQ(sm90::choose_tile(256, 512, 2048, 256, true, dtype, false, kSms), "64x256")
        << dtype_name(dtype);
    // An fp8 out with > 64 rows per expert: the 128-row 256-wide tile, fp8 inputs included.
    EXPECT_EQ(sm90::choose_tile(256 * 128, 512, 2048, 256, true, dtype, true, kSms), "128x256")
        << dtype_name(dtype);
  }
}

TEST(Sm90TileRules, Fp8WideTileRefusesInterleavedAndMxByName) {
  MODMOE_REQUIRE_SM90_KERNELS();
  sm90::GemmArgs interleaved = fp8_gated(1024, GatedLayout::Interleaved);
  interleaved.tile = "128x256";
  const std::string why_interleaved = sm90::can_implement(interleaved);
  EXPECT_THAT(why_interleaved, ::testing::HasSubstr("128x256"));
  EXPECT_THAT(why_interleaved, ::testing::HasSubstr("Interleaved"));

  sm90::GemmArgs mx = fp8_gated(1024, GatedLayout::GateUp);
  mx.mx = true;
  mx.a_scale = mx.b_scale = nullptr;
  mx.a_scale_mx = fake<const uint8_t>(0x70000);
  mx.b_scale_mx = fake<const uint8_t>(0x80000);
  mx.tile = "128x256";
  const std::string why_mx = sm90::can_implement(mx);
  EXPECT_THAT(why_mx, ::testing::HasSubstr("128x256"));
  EXPECT_THAT(why_mx, ::testing::HasSubstr("MX-FP8"));

  // The same tile takes GateUp and UpGate block-scaled fp8 (a check that the refusals above
  // come from the layout and the scales, not from the arguments being unusable).
  for (GatedLayout layout : {GatedLayout::GateUp, GatedLayout::UpGate}) {
    sm90::GemmArgs ok = fp8_gated(1024, layout);
    ok.tile = "128x256";
    EXPECT_EQ(sm90::can_implement(ok), "") << gated_layout_name(layout);
  }
}

TEST(Sm90TileRules, TheHeuristicNeverPicksATileThatRefusesTheCall) {
  MODMOE_REQUIRE_SM90_KERNELS();
  // Where the rule says 128x256, Interleaved and MX calls run 128x128 (64x256 for an fp8 out),
  // so an automatic tile is always accepted.
  sm90::GemmArgs interleaved = fp8_gated(1024, GatedLayout::Interleaved);
  EXPECT_EQ(sm90::can_implement(interleaved), "");

  sm90::GemmArgs interleaved_fp8_out = interleaved;
  interleaved_fp8_out.d_dtype = DType::fp8_e4m3;
  interleaved_fp8_out.d_scale = fake<float>(0x90000);
  EXPECT_EQ(sm90::can_implement(interleaved_fp8_out), "");

  sm90::GemmArgs mx = fp8_gated(1024, GatedLayout::GateUp);
  mx.mx = true;
  mx.a_scale = mx.b_scale = nullptr;
  mx.a_scale_mx = fake<const uint8_t>(0x70000);
  mx.b_scale_mx = fake<const uint8_t>(0x80000);
  EXPECT_EQ(sm90::can_implement(mx), "");
}

}  // namespace
}  // namespace modmoe
