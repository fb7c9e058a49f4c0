// What the Hopper-kernel GPU tests share: the skip where the kernel cannot run, the gated modes,
// m_indptr from per-expert row counts, and a fast seeded uniform generator.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "modmoe/moe_gemm.h"

// After MODMOE_REQUIRE_GPU(): skips unless `gpu` (a CudaSession) can run the Hopper kernel.
#define MODMOE_REQUIRE_SM90(gpu)                                                             \
  do {                                                                                       \
    if (!::modmoe::moe_gemm_sm90_available((gpu).ctx()))                                     \
      GTEST_SKIP() << "the Hopper moe_gemm kernel cannot run here (needs sm_90 and a build " \
                      "with sm_90a)";                                                        \
  } while (0)

namespace modmoe::testing::sm90 {

// plain, or gated with one of the three halves orders.
enum class Mode { plain, gate_up, up_gate, interleaved };

inline const char* mode_name(Mode m) {
  return m == Mode::plain     ? "plain"
         : m == Mode::gate_up ? "GateUp"
         : m == Mode::up_gate ? "UpGate"
                              : "Interleaved";
}

// moe_gemm_groupwise options for the mode (silu when gated).
inline MoeGemmOptions options_for(Mode mode) {
  MoeGemmOptions o;
  o.gated = mode != Mode::plain;
  o.gated_layout = mode == Mode::up_gate       ? GatedLayout::UpGate
                   : mode == Mode::interleaved ? GatedLayout::Interleaved
                                               : GatedLayout::GateUp;
  o.activation = Activation::silu;
  return o;
}

// m_indptr from rows per expert, starting at `first`.
inline std::vector<int32_t> indptr_from_counts(const std::vector<int32_t>& counts,
                                               int32_t first = 0) {
  std::vector<int32_t> indptr = {first};
  for (int32_t c : counts) indptr.push_back(indptr.back() + c);
  return indptr;
}

// Seeded uniform values in [-1, 1): xorshift64*, fast enough for the 16M-element weights of
// the E = 512 cases, where std::normal_distribution would dominate a test's time.
class Uniform {
 public:
  explicit Uniform(uint64_t seed) : state_(seed * 0x9E3779B97F4A7C15ull | 1) {}
  float operator()() {
    state_ ^= state_ >> 12;
    state_ ^= state_ << 25;
    state_ ^= state_ >> 27;
    return static_cast<float>((state_ * 0x2545F4914F6CDD1Dull) >> 40) * (2.0f / 16777216.0f) - 1.0f;
  }

 private:
  uint64_t state_;
};

}  // namespace modmoe::testing::sm90
