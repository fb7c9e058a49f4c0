#include "cpu/rows.h"

#include <cstring>

namespace modmoe::cpu {

void poison(const Tensor& t) {
  if (!t.defined() || t.numel() == 0) return;
  const int64_t n = t.numel();
  switch (t.dtype()) {
    case DType::fp8_e4m3: std::memset(t.data(), 0x7f, n); return;
    case DType::fp8_e5m2: std::memset(t.data(), 0x7f, n); return;
    case DType::e8m0:
    case DType::uint8:
    case DType::int8: std::memset(t.data(), 0xff, n); return;
    case DType::int32:
    case DType::int64: std::memset(t.data(), 0xff, t.nbytes()); return;
    default:
      for (int64_t i = 0; i < n; ++i) store_float(t.data(), t.dtype(), i, NAN);
  }
}

}  // namespace modmoe::cpu
