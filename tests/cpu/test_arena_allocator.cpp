// ArenaAllocator: carving, the stack of frees (in and out of order), a full arena's error, a
// foreign free, and forwards of the modular kernel that take every workspace from an arena and
// give the bytes of the host allocator's forward, leaving the arena empty.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "cpu/prepare_finalize.h"
#include "cpu/reference_experts.h"
#include "modmoe/modmoe.h"
#include "oracle/problem.h"

namespace modmoe {
namespace {

constexpr size_t kAlign = ArenaAllocator::kAlignment;

// kAlign-aligned host memory for an arena.
struct HostArena {
  explicit HostArena(size_t bytes)
      : memory(static_cast<char*>(std::aligned_alloc(kAlign, bytes)), &std::free),
        arena(memory.get(), bytes, Device::cpu()) {}
  std::unique_ptr<char, decltype(&std::free)> memory;
  ArenaAllocator arena;
};

TEST(ArenaAllocator, CarvesAlignedBlocksInOrderAndTracksTheHighWater) {
  HostArena h(4 * kAlign);
  char* a = static_cast<char*>(h.arena.allocate(1, nullptr));
  char* b = static_cast<char*>(h.arena.allocate(kAlign + 1, nullptr));
  EXPECT_EQ(a, h.memory.get());
  EXPECT_EQ(b, a + kAlign);
  EXPECT_EQ(h.arena.in_use(), 3 * kAlign);
  EXPECT_EQ(h.arena.allocate(0, nullptr), nullptr);
  h.arena.deallocate(b, kAlign + 1, nullptr);
  EXPECT_EQ(h.arena.in_use(), kAlign);
  // The freed bytes are handed out again.
  EXPECT_EQ(h.arena.allocate(2 * kAlign, nullptr), b);
  EXPECT_EQ(h.arena.high_water(), 3 * kAlign);
}

TEST(ArenaAllocator, AnEarlierFreeWaitsForTheLaterBlocks) {
  HostArena h(4 * kAlign);
  void* a = h.arena.allocate(kAlign, nullptr);
  void* b = h.arena.allocate(kAlign, nullptr);
  h.arena.deallocate(a, kAlign, nullptr);
  EXPECT_EQ(h.arena.in_use(), 2 * kAlign);  // a is below b: kept until b goes
  h.arena.deallocate(b, kAlign, nullptr);
  EXPECT_EQ(h.arena.in_use(), 0u);
  EXPECT_EQ(h.arena.foreign_frees(), 0u);
}

TEST(ArenaAllocator, AFullArenaNamesTheRequestAndWhatIsLeft) {
  HostArena h(2 * kAlign);
  h.arena.allocate(kAlign + 1, nullptr);
  try {
    h.arena.allocate(1, nullptr);
    FAIL() << "an allocation past the end did not throw";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("cannot allocate 1 bytes"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("512 of its 512 bytes are in use"));
  }
  EXPECT_THROW(ArenaAllocator(h.memory.get() + 1, kAlign, Device::cpu()), Error);
}

TEST(ArenaAllocator, AForeignOrRepeatedFreeIsCountedNotFatal) {
  HostArena h(2 * kAlign);
  void* a = h.arena.allocate(8, nullptr);
  int elsewhere = 0;
  h.arena.deallocate(&elsewhere, sizeof elsewhere, nullptr);
  h.arena.deallocate(a, 8, nullptr);
  h.arena.deallocate(a, 8, nullptr);
  EXPECT_EQ(h.arena.foreign_frees(), 2u);
  EXPECT_EQ(h.arena.in_use(), 0u);
}

using testing::bytes_of;

// Each finalize path (the experts reducing themselves, or the finalize's contiguous reduce over
// a fused output buffer), chunked or not, and fp8-block (the prepare's quantized rows and scales
// live in a vector, whose elements are freed first to last: out of the stack's order): the same
// bytes as with the host allocator.
TEST(ArenaAllocator, AModularKernelForwardTakesItsWorkspacesFromIt) {
  for (QuantScheme scheme : {QuantScheme::none, QuantScheme::fp8_block}) {
    for (bool reduce_in_experts : {true, false}) {
      for (int64_t chunk : {0, 16}) {
        const DType dtype = scheme == QuantScheme::none ? DType::fp32 : DType::bf16;
        testing::Problem p =
            testing::make_problem(testing::simple_spec(40, 4, 16, 128, 96, dtype, scheme));
        const auto& cfg = p.spec.config;
        ModularKernel k(std::make_shared<cpu::NoEPPrepareAndFinalize>(cfg),
                        std::make_shared<cpu::ReferenceExperts>(cfg, reduce_in_experts));
        Context host = Context::cpu();
        host.chunk_size = chunk;
        k.forward(host, p.forward_args());
        const std::vector<uint8_t> expected = bytes_of(p.output);

        HostArena h(size_t(4) << 20);
        Context ctx = host;
        ctx.allocator = &h.arena;
        testing::poison(p.output);
        k.forward(ctx, p.forward_args());
        EXPECT_EQ(bytes_of(p.output), expected)
            << quant_scheme_name(scheme) << ", reduce_in_experts " << reduce_in_experts
            << ", chunk " << chunk;
        EXPECT_GT(h.arena.high_water(), 0u);
        EXPECT_EQ(h.arena.in_use(), 0u);
        EXPECT_EQ(h.arena.foreign_frees(), 0u);
      }
    }
  }
}

}  // namespace
}  // namespace modmoe
