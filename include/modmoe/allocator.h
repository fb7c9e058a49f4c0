// Allocator (host default; the CUDA backend adds a cudaMallocAsync pool) and the owning
// Buffer / OwnedTensor that the modular kernel uses for workspaces.
#pragma once

#include <cstddef>
#include <memory>

#include "modmoe/tensor.h"

namespace modmoe {

class Allocator {
 public:
  virtual ~Allocator() = default;
  // `stream` is a cudaStream_t for device allocators and ignored on the host.
  virtual void* allocate(size_t bytes, void* stream) = 0;
  virtual void deallocate(void* ptr, size_t bytes, void* stream) = 0;
  virtual Device device() const = 0;
};

// 64-byte aligned host memory (std::aligned_alloc). A process-wide singleton.
Allocator* host_allocator();

// Owns `bytes` from an allocator until destroyed. Move-only.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Allocator* allocator, size_t bytes, void* stream = nullptr);
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  size_t size() const { return bytes_; }

 private:
  void release();
  Allocator* allocator_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  void* stream_ = nullptr;
};

// A contiguous tensor together with the memory it views.
class OwnedTensor {
 public:
  OwnedTensor() = default;
  OwnedTensor(Allocator* allocator, DType dtype, const Shape& shape, void* stream = nullptr);

  const Tensor& tensor() const { return tensor_; }
  operator const Tensor&() const { return tensor_; }  // NOLINT: a view is what callers want
  template <typename T>
  T* data_ptr() const {
    return tensor_.data_ptr<T>();
  }

 private:
  Buffer buffer_;
  Tensor tensor_;
};

// Host tensor convenience for tools and tests.
inline OwnedTensor host_tensor(DType dtype, const Shape& shape) {
  return OwnedTensor(host_allocator(), dtype, shape);
}

}  // namespace modmoe
