// Carves typed arrays out of one byte workspace, 256-byte aligned, in a fixed order.
//
// The same carving code runs twice: with a null base to size a workspace (workspace_shapes(),
// on the host, before anything is allocated) and with the allocated base to get the pointers
// (apply()). Because both runs take the same pieces in the same order, the sizes always agree.
#pragma once

#include <cstddef>
#include <cstdint>

namespace modmoe::cuda {

class ByteCarver {
 public:
  static constexpr size_t kAlignment = 256;

  // `base` null: only count bytes (every piece comes back null).
  explicit ByteCarver(void* base) : base_(static_cast<char*>(base)) {}

  // `count` elements of T at the next 256-byte boundary.
  template <typename T>
  T* take(int64_t count) {
    return static_cast<T*>(take_bytes(static_cast<size_t>(count) * sizeof(T)));
  }

  void* take_bytes(size_t bytes) {
    offset_ = round_up(offset_);
    void* piece = base_ ? base_ + offset_ : nullptr;
    offset_ += bytes;
    return piece;
  }

  // Bytes used so far, rounded up to the alignment (never 0, so a workspace is never empty).
  size_t size() const { return offset_ == 0 ? kAlignment : round_up(offset_); }

 private:
  static size_t round_up(size_t n) { return (n + kAlignment - 1) / kAlignment * kAlignment; }

  char* base_;
  size_t offset_ = 0;
};

}  // namespace modmoe::cuda
