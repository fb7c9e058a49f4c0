// Device and Tensor: a non-owning, strided view of memory (rank <= 4).
//
// A Tensor never owns its bytes; OwnedTensor (allocator.h) pairs one with an allocation.
// Shapes and strides are in elements. A default-constructed Tensor is *undefined*
// (optional arguments use that), which is different from a defined tensor with 0 elements.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "modmoe/dtype.h"

namespace modmoe {

enum class DeviceType : uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;

  static Device cpu() { return {DeviceType::cpu, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::cuda, index}; }
  bool is_cpu() const { return type == DeviceType::cpu; }
  bool is_cuda() const { return type == DeviceType::cuda; }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const;  // "cpu" or "cuda:0"
};

using Shape = std::vector<int64_t>;

class Tensor {
 public:
  static constexpr int kMaxDims = 4;

  Tensor() = default;  // undefined
  // A contiguous (row-major) view.
  Tensor(void* data, DType dtype, const Shape& shape, Device device = Device::cpu());
  // A view with explicit strides (in elements).
  Tensor(void* data, DType dtype, const Shape& shape, const Shape& strides, Device device);

  bool defined() const { return ndim_ >= 0; }
  void* data() const { return data_; }
  template <typename T>
  T* data_ptr() const {
    return static_cast<T*>(data_);
  }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  int ndim() const { return ndim_; }
  int64_t size(int dim) const;    // negative dims count from the end
  int64_t stride(int dim) const;  // negative dims count from the end
  Shape shape() const { return Shape(shape_, shape_ + (ndim_ > 0 ? ndim_ : 0)); }
  Shape strides() const { return Shape(strides_, strides_ + (ndim_ > 0 ? ndim_ : 0)); }
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool is_contiguous() const;

  // "(64, 2048)"; "undefined" for an undefined tensor.
  std::string shape_str() const;
  // "bf16 (64, 2048) on cpu"
  std::string describe() const;

  // Views (no copies). All require the result to be expressible with strides.
  Tensor slice(int64_t start, int64_t end) const;  // rows [start, end) of dim 0
  Tensor select(int64_t index) const;              // drops dim 0
  Tensor reshape(const Shape& shape) const;        // contiguous tensors only
  Tensor with_data(void* data) const;              // same layout, other memory

  // True if both views touch overlapping byte ranges (conservative for strided views).
  bool overlaps(const Tensor& other) const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::fp32;
  Device device_{};
  int ndim_ = -1;
  int64_t shape_[kMaxDims] = {0, 0, 0, 0};
  int64_t strides_[kMaxDims] = {0, 0, 0, 0};
};

std::string shape_str(const Shape& shape);
int64_t shape_numel(const Shape& shape);

}  // namespace modmoe
