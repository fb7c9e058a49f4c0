// The Hopper kernel's host-side rules, without a GPU (they run in CI): the tile heuristic, what
// can_implement accepts or refuses for the fp8 128x256 tile, and the tile an fp8 block-scaled
// call with K, N not multiples of 128 (gpt-oss: 2880) resolves to. can_implement reads no
// memory, so the operands are fake, aligned, never-dereferenced addresses; sm_count is given,
// so no device is queried. Skipped in a build without the sm_90a kernels.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda/sm90/sm90_experts.h"
#include "cuda/sm90/sm90_gemm.h"
#include "modmoe/error.h"
#include "modmoe/quant.h"
#include "oracle/problem.h"

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

TEST(Sm90TileRules, PrefillPicks128x256ForFp8AndPlainBf16) {
  MODMOE_REQUIRE_SM90_KERNELS();
  for (DType dtype : {DType::bf16, DType::fp8_e4m3}) {
    // 1024 rows in each of 256 experts: many 128x256 tiles per SM; gated bf16 takes the
    // ping-pong 64x256 (its activation epilogues under the other consumer's main loop).
    EXPECT_EQ(sm90::choose_tile(256 * 1024, 512, 2048, 256, false, dtype, false, kSms), "128x256")
        << dtype_name(dtype);
    EXPECT_EQ(sm90::choose_tile(256 * 1024, 512, 2048, 256, true, dtype, false, kSms),
              dtype == DType::bf16 ? "64x256" : "128x256")
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

// Few long plain bf16 tiles: Mixtral-8x7B M = 1024's GEMM2 (2048 rows over 8 experts, 256 +- 15
// each, N = 4096, K = 14336) is ~2.2 waves of 128x256 tiles by the mean and ~2.4 in fact; by the
// waves x tile-rows model 64x256 fills its waves better (5 x 64 against 3 x 128), and the swapped
// 144x256 best (2 x 144: two tiles cover an expert of up to 288 rows). With a short K (< 4096)
// the swapped tile is not taken (its scattered stores weigh more there), so 64x256. fp8 keeps
// 128x256, with its gated GEMM1; bf16's GEMM1 is on 64x256 by the gated rule
// (PrefillPicks128x256ForFp8AndPlainBf16), never swapped.
TEST(Sm90TileRules, FewLongBf16TilesPickTheTileThatFillsTheLastWave) {
  MODMOE_REQUIRE_SM90_KERNELS();
  EXPECT_EQ(sm90::choose_tile(2048, 4096, 14336, 8, false, DType::bf16, false, kSms), "144x256");
  EXPECT_EQ(sm90::choose_tile(2048, 4096, 2048, 8, false, DType::bf16, false, kSms), "64x256");
  EXPECT_EQ(sm90::choose_tile(2048, 14336, 4096, 8, true, DType::bf16, false, kSms), "64x256");
  EXPECT_EQ(sm90::choose_tile(2048, 4096, 14336, 8, false, DType::fp8_e4m3, false, kSms),
            "128x256");
  EXPECT_EQ(sm90::choose_tile(2048, 14336, 4096, 8, true, DType::fp8_e4m3, false, kSms), "128x256");
  // Mixtral M = 8192's GEMM2: ~16 waves, the last one matters little.
  EXPECT_EQ(sm90::choose_tile(16384, 4096, 14336, 8, false, DType::bf16, false, kSms), "128x256");
}

// The swapped 144x256 tile runs plain bf16 GEMMs with a 16-bit or fp32 out only: where the
// heuristic picks it for a call with the folded reduce, the call resolves to the heuristic's
// pick among the other tiles; asked for by name, a gated or fp8 call is refused, saying why.
TEST(Sm90TileRules, SwappedTileRunsPlainBf16GemmsOnly) {
  MODMOE_REQUIRE_SM90_KERNELS();
  sm90::GemmArgs g = fp8_gated(256, GatedLayout::GateUp);  // Mixtral M = 1024's GEMM2 below
  g.ab_dtype = DType::bf16;
  g.a_scale = g.b_scale = nullptr;
  g.gated = false;
  g.E = 8;
  g.K = 14336;
  g.N_b = 4096;
  g.total_rows = 2048;
  g.d_dtype = DType::bf16;
  EXPECT_EQ(sm90::resolve_tile(g), "144x256");
  EXPECT_EQ(sm90::can_implement(g), "");
  EXPECT_TRUE(sm90::tile_runs("144x256", DType::bf16, false));
  EXPECT_FALSE(sm90::tile_runs("144x256", DType::bf16, true));
  EXPECT_FALSE(sm90::tile_runs("144x256", DType::fp8_e4m3, false));
  EXPECT_TRUE(sm90::tile_runs("64x256", DType::fp8_e4m3, true));
  EXPECT_FALSE(sm90::tile_runs("no such tile", DType::bf16, false));

  sm90::GemmArgs fold = g;
  fold.d_dtype = DType::fp32;
  fold.row_pair = fake<const int32_t>(0xa0000);
  fold.topk = 2;
  EXPECT_EQ(sm90::resolve_tile(fold), "64x256");
  EXPECT_EQ(sm90::can_implement(fold), "");
  fold.tile = "144x256";
  EXPECT_THAT(sm90::can_implement(fold),
              ::testing::AllOf(::testing::HasSubstr("swapped operands"),
                               ::testing::HasSubstr("no folded top-k reduce")));

  sm90::GemmArgs gated = g;
  gated.gated = true;
  gated.tile = "144x256";
  EXPECT_THAT(sm90::can_implement(gated), ::testing::HasSubstr("plain GEMMs only"));
  sm90::GemmArgs fp8 = fp8_gated(256, GatedLayout::GateUp);
  fp8.gated = false;
  fp8.tile = "144x256";
  EXPECT_THAT(sm90::can_implement(fp8), ::testing::HasSubstr("is not built for fp8_e4m3"));
}

// Sets (value) or unsets (nullptr) an environment variable for one scope, then restores what
// was there (POSIX setenv; the tests run in one thread).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* before = std::getenv(name);
    had_ = before != nullptr;
    if (had_) before_ = before;
    if (value != nullptr) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_, before_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  bool had_ = false;
  std::string before_;
};

// MODMOE_SM90_TILE_GATED / _PLAIN, the developer's override for tile studies: the tile gated /
// plain GEMMs start from instead of the heuristic's, each variable for its kind only, stepped
// down like the heuristic's pick when it refuses the call; a name that is no tile is refused
// (by the variable's name), not passed on to a refusal that `automatic` would turn into the
// portable kernel.
TEST(Sm90TileRules, EnvironmentNamesTheTileAStudyStartsFrom) {
  MODMOE_REQUIRE_SM90_KERNELS();
  // Whatever the shell set, this test starts from the heuristic's tiles.
  const ScopedEnv no_gated("MODMOE_SM90_TILE_GATED", nullptr);
  const ScopedEnv no_plain("MODMOE_SM90_TILE_PLAIN", nullptr);
  sm90::GemmArgs gated = fp8_gated(1024, GatedLayout::GateUp);
  sm90::GemmArgs plain = gated;
  plain.gated = false;
  plain.d_dtype = DType::fp32;
  ASSERT_EQ(sm90::resolve_tile(gated), "128x256");
  ASSERT_EQ(sm90::resolve_tile(plain), "128x256");
  {
    const ScopedEnv env("MODMOE_SM90_TILE_GATED", "64x128");
    EXPECT_EQ(sm90::resolve_tile(gated), "64x128");
    EXPECT_EQ(sm90::can_implement(gated), "");
    EXPECT_EQ(sm90::resolve_tile(plain), "128x256");
    // An explicit args.tile still wins.
    sm90::GemmArgs pinned = gated;
    pinned.tile = "128x128";
    EXPECT_EQ(sm90::resolve_tile(pinned), "128x128");
  }
  {
    const ScopedEnv env("MODMOE_SM90_TILE_PLAIN", "64x64");
    EXPECT_EQ(sm90::resolve_tile(plain), "64x64");
    EXPECT_EQ(sm90::resolve_tile(gated), "128x256");
  }
  {
    // MX takes no 256-wide tile: the override steps down as the heuristic's pick does.
    const ScopedEnv env("MODMOE_SM90_TILE_GATED", "128x256");
    sm90::GemmArgs mx = gated;
    mx.mx = true;
    mx.a_scale = mx.b_scale = nullptr;
    mx.a_scale_mx = fake<const uint8_t>(0x70000);
    mx.b_scale_mx = fake<const uint8_t>(0x80000);
    EXPECT_EQ(sm90::resolve_tile(mx), "128x128");
  }
  {
    const ScopedEnv env("MODMOE_SM90_TILE_GATED", "96x96");
    try {
      sm90::resolve_tile(gated);
      ADD_FAILURE() << "an unknown tile name was accepted";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr("MODMOE_SM90_TILE_GATED"));
      EXPECT_THAT(e.what(), ::testing::HasSubstr("\"96x96\""));
      EXPECT_THAT(e.what(), ::testing::HasSubstr("128x256"));
    }
  }
  EXPECT_EQ(sm90::resolve_tile(gated), "128x256");  // unset again: the heuristic's
}

TEST(Sm90TileRules, Fp8WideTileRefusesMxByName) {
  MODMOE_REQUIRE_SM90_KERNELS();
  sm90::GemmArgs mx = fp8_gated(1024, GatedLayout::GateUp);
  mx.mx = true;
  mx.a_scale = mx.b_scale = nullptr;
  mx.a_scale_mx = fake<const uint8_t>(0x70000);
  mx.b_scale_mx = fake<const uint8_t>(0x80000);
  // Both 256-wide tiles: 128x256 (split M) and 64x256 (ping-pong) have consumers of 256 columns.
  for (const char* wide : {"128x256", "64x256"}) {
    mx.tile = wide;
    const std::string why_mx = sm90::can_implement(mx);
    EXPECT_THAT(why_mx, ::testing::HasSubstr(wide));
    EXPECT_THAT(why_mx, ::testing::HasSubstr("MX-FP8"));

    // The same tile takes every gated layout with block scales (a check that the refusal above
    // comes from the scales, not from the arguments being unusable): an Interleaved half of 128
    // outputs spans 256 rows of b, and each 64-output part reads its own weight scale.
    for (GatedLayout layout :
         {GatedLayout::GateUp, GatedLayout::UpGate, GatedLayout::Interleaved}) {
      sm90::GemmArgs ok = fp8_gated(1024, layout);
      ok.tile = wide;
      EXPECT_EQ(sm90::can_implement(ok), "") << wide << " " << gated_layout_name(layout);
    }
  }
  // At decode sizes (rows <= 64 per expert) an MX call steps down to 64x128.
  mx.tile.clear();
  mx.total_rows = 256;
  EXPECT_EQ(sm90::resolve_tile(mx), "64x128");
  EXPECT_EQ(sm90::can_implement(mx), "");
}

TEST(Sm90TileRules, TheHeuristicNeverPicksATileThatRefusesTheCall) {
  MODMOE_REQUIRE_SM90_KERNELS();
  // Where the rule says 128x256, MX calls run 128x128, so an automatic tile is always accepted;
  // Interleaved keeps 128x256 (bf16 and fp8 outs).
  sm90::GemmArgs interleaved = fp8_gated(1024, GatedLayout::Interleaved);
  EXPECT_EQ(sm90::can_implement(interleaved), "");
  EXPECT_EQ(sm90::resolve_tile(interleaved), "128x256");

  sm90::GemmArgs interleaved_fp8_out = interleaved;
  interleaved_fp8_out.d_dtype = DType::fp8_e4m3;
  interleaved_fp8_out.d_scale = fake<float>(0x90000);
  EXPECT_EQ(sm90::can_implement(interleaved_fp8_out), "");
  EXPECT_EQ(sm90::resolve_tile(interleaved_fp8_out), "128x256");

  sm90::GemmArgs mx = fp8_gated(1024, GatedLayout::GateUp);
  mx.mx = true;
  mx.a_scale = mx.b_scale = nullptr;
  mx.a_scale_mx = fake<const uint8_t>(0x70000);
  mx.b_scale_mx = fake<const uint8_t>(0x80000);
  EXPECT_EQ(sm90::can_implement(mx), "");
  EXPECT_EQ(sm90::resolve_tile(mx), "128x128");
}

// ---- fp8 block scales with K, N not multiples of 128 ------------------------------------------

// B rows (Interleaved: outputs) of one consumer's accumulator half that share one weight scale
// for tile "BMxBN": the kernel's kWgN / 2, but 64 for the 128-row halves of the 256-wide tiles,
// which read one scale per 64 rows. A consumer holds all BN columns of its rows in the 128-row
// tiles (split M) and in 64x256 (ping-pong), half of them in the other 64-row tiles (split N).
int scale_rows(const std::string& tile) {
  const int bm = std::stoi(tile.substr(0, tile.find('x')));
  const int bn = std::stoi(tile.substr(tile.find('x') + 1));
  const bool whole_rows = bm == 128 || bn == 256;
  const int half = (whole_rows ? bn : bn / 2) / 2;
  return half == 128 ? 64 : half;
}

// gpt-oss-120b's GEMM1 (E = 128, K = 2880, w13 (E, 2 * 2880, 2880)) with `rows` permuted rows.
sm90::GemmArgs gpt_oss_gemm1(int64_t rows, GatedLayout layout, bool fp8_out) {
  sm90::GemmArgs g = fp8_gated(1, layout);
  g.E = 128;
  g.K = 2880;
  g.N_b = 2 * 2880;
  g.total_rows = rows;
  if (fp8_out) {
    g.d_dtype = DType::fp8_e4m3;
    g.d_scale = fake<float>(0x90000);
  }
  return g;
}

TEST(Sm90TileRules, Fp8BlockGptOssShapesResolveToATileWhoseScalePartsFitOneBlock) {
  MODMOE_REQUIRE_SM90_KERNELS();
  // 2880 = 22.5 * 128: the up rows of GateUp start at row 2880, 64 rows into a 128-row weight
  // scale block; every tile's scale parts are <= 64 rows, so every tile takes it, and the
  // heuristic's pick stands: 128x256 at prefill (> 64 rows per expert), 64x256 below.
  for (GatedLayout layout : {GatedLayout::GateUp, GatedLayout::UpGate, GatedLayout::Interleaved}) {
    for (int64_t rows : {int64_t{128}, int64_t{4096}, int64_t{32768}}) {
      for (bool fp8_out : {false, true}) {
        const sm90::GemmArgs g = gpt_oss_gemm1(rows, layout, fp8_out);
        const std::string tile = sm90::resolve_tile(g);
        const std::string what = std::string(gated_layout_name(layout)) + " rows " +
                                 std::to_string(rows) + (fp8_out ? " fp8 out" : " bf16 out") +
                                 " tile " + tile;
        EXPECT_EQ(sm90::can_implement(g), "") << what;
        EXPECT_EQ(2880 % scale_rows(tile), 0) << what;
        if (fp8_out) EXPECT_EQ(tile, rows > 64 * 128 ? "128x256" : "64x256") << what;
      }
    }
    EXPECT_EQ(sm90::resolve_tile(gpt_oss_gemm1(32768, layout, false)), "128x256")
        << gated_layout_name(layout);
  }
  // GEMM2 (plain, w2 (E, 2880, 2880)): a half starts at a multiple of its size, so every tile
  // fits, and K = 2880 (a partial last K block) is accepted.
  sm90::GemmArgs g2 = gpt_oss_gemm1(32768, GatedLayout::GateUp, false);
  g2.gated = false;
  g2.N_b = 2880;
  g2.d_dtype = DType::fp32;
  EXPECT_EQ(sm90::resolve_tile(g2), "128x256");
  for (const std::string& tile : sm90::tile_names()) {
    if (!sm90::tile_runs(tile, DType::fp8_e4m3, false)) continue;
    g2.tile = tile;
    EXPECT_EQ(sm90::can_implement(g2), "") << "plain fp8 N_b = K = 2880, tile " << tile;
  }
}

TEST(Sm90TileRules, Fp8BlockGatedRefusesTilesWhoseScalePartsStraddleABlockByName) {
  MODMOE_REQUIRE_SM90_KERNELS();
  // N = 2848 = 89 * 32: the up rows start 32 rows into a scale block. Only the 32- and 16-row
  // halves (64x128, 64x64) fit; the others refuse by name and say what they need.
  sm90::GemmArgs g = gpt_oss_gemm1(32768, GatedLayout::GateUp, false);
  g.N_b = 2 * 2848;
  for (const char* refuses : {"128x256", "128x128", "64x256"}) {
    g.tile = refuses;
    const std::string why = sm90::can_implement(g);
    EXPECT_THAT(why, ::testing::HasSubstr(refuses));
    EXPECT_THAT(why, ::testing::HasSubstr("N = b.size(1)/2 = 2848"));
    EXPECT_THAT(why, ::testing::HasSubstr("N % 64 == 0"));
  }
  for (const char* fits : {"64x128", "64x64"}) {
    g.tile = fits;
    EXPECT_EQ(sm90::can_implement(g), "") << fits;
  }
  // The heuristic's pick steps down to 64x128; an fp8 out (256-wide tiles only) has no tile
  // and says why.
  g.tile.clear();
  EXPECT_EQ(sm90::resolve_tile(g), "64x128");
  EXPECT_EQ(sm90::can_implement(g), "");
  g.d_dtype = DType::fp8_e4m3;
  g.d_scale = fake<float>(0x90000);
  const std::string why_fp8_out = sm90::can_implement(g);
  EXPECT_THAT(why_fp8_out, ::testing::HasSubstr("N % 64 == 0"));
  EXPECT_THAT(why_fp8_out, ::testing::HasSubstr("2848"));
}

// The Sm90Experts config rule that follows: fp8_block takes K, N multiples of 16, and N % 64
// for GateUp/UpGate (GEMM1's fp8 out needs a 256-wide tile; 64x256 and 128x256 read one weight
// scale per 64 gate or up rows).
TEST(Sm90TileRules, Sm90ExpertsTakeFp8BlockWithUnalignedKAndN) {
  MoEConfig c =
      testing::simple_spec(1, 4, 128, 2880, 2880, DType::bf16, QuantScheme::fp8_block).config;
  c.activation = Activation::swigluoai;
  for (GatedLayout layout : {GatedLayout::GateUp, GatedLayout::UpGate, GatedLayout::Interleaved}) {
    c.gated_layout = layout;
    EXPECT_EQ(cuda::sm90_experts_unsupported(c), "") << gated_layout_name(layout);
  }
  c.intermediate_size = 2848;  // a multiple of 32, not of 64
  c.gated_layout = GatedLayout::Interleaved;
  EXPECT_EQ(cuda::sm90_experts_unsupported(c), "");
  c.gated_layout = GatedLayout::GateUp;
  const std::string why = cuda::sm90_experts_unsupported(c);
  EXPECT_THAT(why, ::testing::HasSubstr("N to be a multiple of 64"));
  EXPECT_THAT(why, ::testing::HasSubstr("N = 2848"));
  c.intermediate_size = 2880;
  c.hidden_size = 2888;  // not a multiple of 16 (TMA's 16-byte row pitch)
  EXPECT_THAT(cuda::sm90_experts_unsupported(c), ::testing::HasSubstr("multiples of 16"));
}

}  // namespace
}  // namespace modmoe
