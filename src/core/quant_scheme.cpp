// Quantization scheme names and the scale layouts of ARCHITECTURE.md §5 (see quant.h).
#include "modmoe/error.h"
#include "modmoe/quant.h"

namespace modmoe {

namespace {
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
}  // namespace

const char* quant_scheme_name(QuantScheme scheme) {
  switch (scheme) {
    case QuantScheme::none: return "none";
    case QuantScheme::fp8_tensor: return "fp8-tensor";
    case QuantScheme::fp8_token: return "fp8-token";
    case QuantScheme::fp8_block: return "fp8-block";
    case QuantScheme::mxfp8: return "mxfp8";
  }
  return "?";
}

QuantScheme parse_quant_scheme(const std::string& name) {
  for (QuantScheme s : {QuantScheme::none, QuantScheme::fp8_tensor, QuantScheme::fp8_token,
                        QuantScheme::fp8_block, QuantScheme::mxfp8})
    if (name == quant_scheme_name(s)) return s;
  MODMOE_FAIL() << "unknown quant scheme '" << name
                << "', expected one of none, fp8-tensor, fp8-token, fp8-block, mxfp8";
  return QuantScheme::none;
}

std::string QuantConfig::str() const {
  return std::string(quant_scheme_name(scheme)) + (static_act_scale ? "-static" : "");
}

DType quantized_dtype(QuantScheme scheme) {
  MODMOE_CHECK(scheme != QuantScheme::none) << "quantized_dtype: scheme 'none' has no quantized dtype";
  return DType::fp8_e4m3;
}

DType scale_dtype(QuantScheme scheme) {
  MODMOE_CHECK(scheme != QuantScheme::none) << "scale_dtype: scheme 'none' has no scales";
  return scheme == QuantScheme::mxfp8 ? DType::e8m0 : DType::fp32;
}

int64_t scale_group_k(QuantScheme scheme, int64_t K) {
  switch (scheme) {
    case QuantScheme::fp8_block: return kBlockSize;
    case QuantScheme::mxfp8: return kMxBlockSize;
    default: return K;
  }
}

Shape act_scale_shape(QuantScheme scheme, int64_t M, int64_t K) {
  switch (scheme) {
    case QuantScheme::none: return {};
    case QuantScheme::fp8_tensor: return {1};
    case QuantScheme::fp8_token: return {M, 1};
    case QuantScheme::fp8_block: return {M, ceil_div(K, kBlockSize)};
    case QuantScheme::mxfp8: return {M, ceil_div(K, kMxBlockSize)};
  }
  return {};
}

Shape weight_scale_shape(QuantScheme scheme, int64_t E, int64_t N, int64_t K) {
  switch (scheme) {
    case QuantScheme::none: return {};
    case QuantScheme::fp8_tensor: return {E};
    case QuantScheme::fp8_token: return {E, N};
    case QuantScheme::fp8_block: return {E, ceil_div(N, kBlockSize), ceil_div(K, kBlockSize)};
    case QuantScheme::mxfp8: return {E, N, ceil_div(K, kMxBlockSize)};
  }
  return {};
}

}  // namespace modmoe
