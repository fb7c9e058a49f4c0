#include "modmoe/allocator.h"

#include <cstdlib>
#include <utility>

#include "modmoe/context.h"
#include "modmoe/error.h"

namespace modmoe {

namespace {
class HostAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes, void*) override {
    if (bytes == 0) return nullptr;
    constexpr size_t kAlign = 64;
    void* p = std::aligned_alloc(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
    MODMOE_CHECK(p != nullptr) << "host allocator: out of memory allocating " << bytes << " bytes";
    return p;
  }
  void deallocate(void* ptr, size_t, void*) override { std::free(ptr); }
  Device device() const override { return Device::cpu(); }
};
}  // namespace

Allocator* host_allocator() {
  static HostAllocator allocator;
  return &allocator;
}

Buffer::Buffer(Allocator* allocator, size_t bytes, void* stream)
    : allocator_(allocator), bytes_(bytes), stream_(stream) {
  MODMOE_CHECK(allocator != nullptr) << "Buffer: allocator must not be null";
  data_ = allocator_->allocate(bytes, stream);
}

Buffer::~Buffer() { release(); }

Buffer::Buffer(Buffer&& other) noexcept { *this = std::move(other); }

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    allocator_ = std::exchange(other.allocator_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

void Buffer::release() {
  if (allocator_ && data_) allocator_->deallocate(data_, bytes_, stream_);
  data_ = nullptr;
  bytes_ = 0;
}

OwnedTensor::OwnedTensor(Allocator* allocator, DType dtype, const Shape& shape, void* stream)
    : buffer_(allocator, static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype), stream),
      tensor_(buffer_.data(), dtype, shape, allocator->device()) {}

}  // namespace modmoe
