#include "modmoe/arena_allocator.h"

#include <cstdint>

#include "modmoe/error.h"

namespace modmoe {

ArenaAllocator::ArenaAllocator(void* base, size_t bytes, Device device)
    : base_(static_cast<char*>(base)), bytes_(bytes), device_(device) {
  MODMOE_CHECK(base != nullptr || bytes == 0)
      << "ArenaAllocator: base must not be null for " << bytes << " bytes";
  MODMOE_CHECK(reinterpret_cast<uintptr_t>(base) % kAlignment == 0)
      << "ArenaAllocator: base must be " << kAlignment << "-byte aligned, got address " << base;
}

void* ArenaAllocator::allocate(size_t bytes, void*) {
  if (bytes == 0) return nullptr;
  const size_t size = footprint(bytes);
  MODMOE_CHECK(size >= bytes && size <= bytes_ - top_)
      << "ArenaAllocator: cannot allocate " << bytes << " bytes: " << top_ << " of its " << bytes_
      << " bytes are in use (" << bytes_ - top_
      << " free); size the arena by high_water() after a forward of the largest shape";
  blocks_.push_back({top_, top_ + size, false});
  top_ += size;
  if (top_ > high_water_) high_water_ = top_;
  return base_ + blocks_.back().offset;
}

void ArenaAllocator::deallocate(void* ptr, size_t, void*) {
  if (ptr == nullptr) return;
  const char* p = static_cast<const char*>(ptr);
  // The last blocks are the likely ones (scoped workspaces free in reverse order).
  for (size_t i = blocks_.size(); i-- > 0;) {
    Block& b = blocks_[i];
    if (base_ + b.offset != p || b.freed) continue;
    b.freed = true;
    while (!blocks_.empty() && blocks_.back().freed) {
      top_ = blocks_.back().offset;
      blocks_.pop_back();
    }
    return;
  }
  ++foreign_frees_;
}

}  // namespace modmoe
