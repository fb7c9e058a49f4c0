#include "modmoe/tensor.h"

#include <algorithm>
#include <sstream>

#include "modmoe/error.h"

namespace modmoe {

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

std::string shape_str(const Shape& shape) {
  std::ostringstream s;
  s << "(";
  for (size_t i = 0; i < shape.size(); ++i) s << (i ? ", " : "") << shape[i];
  if (shape.size() == 1) s << ",";
  s << ")";
  return s.str();
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Tensor::Tensor(void* data, DType dtype, const Shape& shape, Device device)
    : data_(data), dtype_(dtype), device_(device) {
  MODMOE_CHECK(shape.size() <= kMaxDims)
      << "Tensor: at most " << kMaxDims << " dimensions are supported, got " << shape.size();
  ndim_ = static_cast<int>(shape.size());
  int64_t stride = 1;
  for (int d = ndim_ - 1; d >= 0; --d) {
    MODMOE_CHECK(shape[d] >= 0) << "Tensor: sizes must be >= 0, got " << modmoe::shape_str(shape);
    shape_[d] = shape[d];
    strides_[d] = stride;
    stride *= std::max<int64_t>(shape[d], 1);
  }
}

Tensor::Tensor(void* data, DType dtype, const Shape& shape, const Shape& strides, Device device)
    : data_(data), dtype_(dtype), device_(device) {
  MODMOE_CHECK(shape.size() <= kMaxDims)
      << "Tensor: at most " << kMaxDims << " dimensions are supported, got " << shape.size();
  MODMOE_CHECK(shape.size() == strides.size())
      << "Tensor: shape " << modmoe::shape_str(shape) << " and strides "
      << modmoe::shape_str(strides) << " must have the same length";
  ndim_ = static_cast<int>(shape.size());
  for (int d = 0; d < ndim_; ++d) {
    MODMOE_CHECK(shape[d] >= 0) << "Tensor: sizes must be >= 0, got " << modmoe::shape_str(shape);
    shape_[d] = shape[d];
    strides_[d] = strides[d];
  }
}

int64_t Tensor::size(int dim) const {
  const int d = dim < 0 ? dim + ndim_ : dim;
  MODMOE_CHECK(d >= 0 && d < ndim_)
      << "Tensor::size: dimension " << dim << " out of range for a " << ndim_ << "-D tensor";
  return shape_[d];
}

int64_t Tensor::stride(int dim) const {
  const int d = dim < 0 ? dim + ndim_ : dim;
  MODMOE_CHECK(d >= 0 && d < ndim_)
      << "Tensor::stride: dimension " << dim << " out of range for a " << ndim_ << "-D tensor";
  return strides_[d];
}

int64_t Tensor::numel() const {
  if (!defined()) return 0;
  int64_t n = 1;
  for (int d = 0; d < ndim_; ++d) n *= shape_[d];
  return n;
}

bool Tensor::is_contiguous() const {
  if (!defined()) return false;
  int64_t expected = 1;
  for (int d = ndim_ - 1; d >= 0; --d) {
    if (shape_[d] != 1 && strides_[d] != expected) return false;
    expected *= std::max<int64_t>(shape_[d], 1);
  }
  return true;
}

std::string Tensor::shape_str() const {
  return defined() ? modmoe::shape_str(shape()) : std::string("undefined");
}

std::string Tensor::describe() const {
  if (!defined()) return "undefined";
  return std::string(dtype_name(dtype_)) + " " + shape_str() + " on " + device_.str();
}

Tensor Tensor::slice(int64_t start, int64_t end) const {
  MODMOE_CHECK(ndim_ >= 1) << "Tensor::slice: needs at least 1 dimension";
  MODMOE_CHECK(0 <= start && start <= end && end <= shape_[0])
      << "Tensor::slice: range [" << start << ", " << end << ") out of bounds for size "
      << shape_[0];
  Tensor t = *this;
  t.data_ = static_cast<char*>(data_) + start * strides_[0] * static_cast<int64_t>(dtype_size(dtype_));
  t.shape_[0] = end - start;
  return t;
}

Tensor Tensor::select(int64_t index) const {
  MODMOE_CHECK(ndim_ >= 1) << "Tensor::select: needs at least 1 dimension";
  MODMOE_CHECK(0 <= index && index < shape_[0])
      << "Tensor::select: index " << index << " out of bounds for size " << shape_[0];
  Shape shape(shape_ + 1, shape_ + ndim_), strides(strides_ + 1, strides_ + ndim_);
  return Tensor(static_cast<char*>(data_) + index * strides_[0] * static_cast<int64_t>(dtype_size(dtype_)),
                dtype_, shape, strides, device_);
}

Tensor Tensor::reshape(const Shape& shape) const {
  MODMOE_CHECK(is_contiguous()) << "Tensor::reshape: needs a contiguous tensor";
  MODMOE_CHECK(shape_numel(shape) == numel())
      << "Tensor::reshape: cannot view " << shape_str() << " as " << modmoe::shape_str(shape);
  return Tensor(data_, dtype_, shape, device_);
}

Tensor Tensor::with_data(void* data) const {
  Tensor t = *this;
  t.data_ = data;
  return t;
}

bool Tensor::overlaps(const Tensor& other) const {
  if (!defined() || !other.defined() || numel() == 0 || other.numel() == 0) return false;
  if (device_ != other.device_) return false;
  auto extent = [](const Tensor& t) {
    int64_t last = 0;
    for (int d = 0; d < t.ndim_; ++d) last += (t.shape_[d] - 1) * t.strides_[d];
    const char* begin = static_cast<const char*>(t.data_);
    return std::make_pair(begin, begin + (last + 1) * static_cast<int64_t>(dtype_size(t.dtype_)));
  };
  const auto a = extent(*this), b = extent(other);
  return a.first < b.second && b.first < a.second;
}

}  // namespace modmoe
