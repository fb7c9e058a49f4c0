// ArenaAllocator: an Allocator over one buffer the caller owns, for forwards that must not
// allocate — a CUDA graph captured without memory nodes (with the default cudaMallocAsync pool
// every captured forward adds an allocation and a free node for its workspaces), or a fixed memory
// budget. Pass it as Context::allocator.
#pragma once

#include <cstddef>
#include <vector>

#include "modmoe/allocator.h"

namespace modmoe {

// Allocations are carved from the buffer in order (each kAlignment-aligned) and live as a
// stack: a free releases its bytes once every later allocation is freed too, which the
// modular kernel's scoped workspaces always are (a free out of order is kept until then).
//
// Stream order is what makes reuse safe: memory freed by one forward and handed to the next is
// only touched by work queued after the first forward's on the same stream. So one arena serves
// one stream (or one captured graph, whose replays run in order) at a time; forwards on two
// streams at once need an arena each. A captured graph keeps the addresses it was captured
// with: the buffer must outlive it, and its replays must not overlap other users of the arena.
// Not thread-safe: one thread allocates from it at a time.
class ArenaAllocator final : public Allocator {
 public:
  static constexpr size_t kAlignment = 256;
  // The bytes an allocation of `bytes` takes from the arena (rounded up to kAlignment).
  static constexpr size_t footprint(size_t bytes) {
    return (bytes + kAlignment - 1) / kAlignment * kAlignment;
  }

  // `base`: `bytes` of memory on `device` (kAlignment-aligned), owned by the caller.
  ArenaAllocator(void* base, size_t bytes, Device device);

  // Throws Error naming the request and what is left when the buffer cannot hold it.
  void* allocate(size_t bytes, void* stream) override;
  // Never throws (Buffer calls it from its destructor); a pointer the arena did not hand out,
  // or freed twice, is ignored and counted (foreign_frees()).
  void deallocate(void* ptr, size_t bytes, void* stream) override;
  Device device() const override { return device_; }

  size_t capacity() const { return bytes_; }
  size_t in_use() const { return top_; }
  // The most bytes in use at once (alignment included) since construction: what to size the
  // buffer by after one forward of the largest shape.
  size_t high_water() const { return high_water_; }
  size_t foreign_frees() const { return foreign_frees_; }

 private:
  struct Block {
    size_t offset, end;
    bool freed;
  };
  char* base_;
  size_t bytes_;
  Device device_;
  std::vector<Block> blocks_;  // live (or freed out of order) allocations, in address order
  size_t top_ = 0, high_water_ = 0, foreign_frees_ = 0;
};

}  // namespace modmoe
