#include "modmoe/dtype.h"

#include "modmoe/error.h"

namespace modmoe {

namespace {
struct DTypeInfo {
  DType dtype;
  const char* name;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::bf16, "bf16", 2},         {DType::fp16, "fp16", 2},   {DType::fp32, "fp32", 4},
    {DType::fp64, "fp64", 8},         {DType::fp8_e4m3, "fp8_e4m3", 1},
    {DType::fp8_e5m2, "fp8_e5m2", 1}, {DType::e8m0, "e8m0", 1},   {DType::int8, "int8", 1},
    {DType::int32, "int32", 4},       {DType::int64, "int64", 8}, {DType::uint8, "uint8", 1},
};
const DTypeInfo& info(DType d) {
  for (const auto& i : kDTypes)
    if (i.dtype == d) return i;
  MODMOE_FAIL() << "unknown dtype code " << static_cast<int>(d);
  return kDTypes[0];  // unreachable
}
}  // namespace

size_t dtype_size(DType dtype) { return info(dtype).size; }
const char* dtype_name(DType dtype) { return info(dtype).name; }

DType parse_dtype(const std::string& name) {
  for (const auto& i : kDTypes)
    if (name == i.name) return i.dtype;
  if (name == "bfloat16") return DType::bf16;
  if (name == "float16" || name == "half") return DType::fp16;
  if (name == "float32" || name == "float") return DType::fp32;
  MODMOE_FAIL() << "parse_dtype: unknown dtype '" << name
                << "', expected one of bf16, fp16, fp32, fp64, fp8_e4m3, fp8_e5m2, e8m0, int8, "
                   "int32, int64, uint8";
  return DType::fp32;
}

}  // namespace modmoe
