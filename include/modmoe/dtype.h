// Element types and their sizes and names.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace modmoe {

enum class DType : uint8_t {
  bf16,
  fp16,
  fp32,
  fp64,
  fp8_e4m3,
  fp8_e5m2,
  e8m0,  // MX shared scale: an 8-bit power of two, 2^(bits - 127); 0xFF is NaN
  int8,
  int32,
  int64,
  uint8,
};

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
// Parses the names dtype_name prints ("bf16", "fp8_e4m3", ...); throws Error otherwise.
DType parse_dtype(const std::string& name);

inline bool is_float_dtype(DType d) {
  return d == DType::bf16 || d == DType::fp16 || d == DType::fp32 || d == DType::fp64;
}
inline bool is_fp8_dtype(DType d) { return d == DType::fp8_e4m3 || d == DType::fp8_e5m2; }
inline bool is_index_dtype(DType d) { return d == DType::int32 || d == DType::int64; }

}  // namespace modmoe
