// The float64 oracle (see oracle.h). Nothing here calls a modmoe backend: inputs are decoded
// element by element, every product and sum is in double, and the quantizations the scheme
// prescribes are emulated with the oracle's own e4m3 rounding.
#include "oracle/oracle.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "modmoe/error.h"

namespace modmoe {
namespace oracle {

// ---- scalar decoders ------------------------------------------------------------------------

double decode_bf16(uint16_t bits) {
  // bf16 is the top half of an fp32.
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

double decode_fp16(uint16_t bits) {
  const int exponent = (bits >> 10) & 0x1f;
  const int mantissa = bits & 0x3ff;
  double v;
  if (exponent == 0x1f) {
    v = mantissa ? std::numeric_limits<double>::quiet_NaN() : HUGE_VAL;
  } else if (exponent == 0) {
    v = std::ldexp(static_cast<double>(mantissa), -24);  // subnormal: m * 2^(1 - 15 - 10)
  } else {
    v = std::ldexp(static_cast<double>(mantissa + 1024), exponent - 25);
  }
  return (bits & 0x8000) ? -v : v;
}

double decode_e4m3(uint8_t code) {
  const int exponent = (code >> 3) & 0xf;
  const int mantissa = code & 0x7;
  double v;
  if (exponent == 0xf && mantissa == 0x7) {
    v = std::numeric_limits<double>::quiet_NaN();  // e4m3fn has no Inf
  } else if (exponent == 0) {
    v = std::ldexp(static_cast<double>(mantissa), -9);  // subnormal: m * 2^(1 - 7 - 3)
  } else {
    v = std::ldexp(static_cast<double>(mantissa + 8), exponent - 10);
  }
  return (code & 0x80) ? -v : v;
}

double decode_e8m0(uint8_t code) {
  return code == 0xff ? std::numeric_limits<double>::quiet_NaN()
                      : std::ldexp(1.0, static_cast<int>(code) - 127);
}

double round_to_e4m3(double v) {
  constexpr double kMax = 448.0;
  if (std::isnan(v)) return v;
  const double a = std::fabs(v);
  if (a >= kMax) return std::copysign(kMax, v);  // saturate (satfinite)
  if (a == 0) return v;
  int binade_exp;
  std::frexp(a, &binade_exp);  // a = f * 2^binade_exp, f in [0.5, 1)
  // Normal binades [2^e, 2^(e+1)) hold 8 values (3 mantissa bits); below 2^-6 the quantum of
  // the subnormals, 2^-9, applies.
  const int e = std::max(binade_exp - 1, -6);
  const double quantum = std::ldexp(1.0, e - 3);
  const double steps = a / quantum;  // exact: power-of-two scaling
  double rounded = std::floor(steps);
  const double fraction = steps - rounded;
  if (fraction > 0.5 || (fraction == 0.5 && std::fmod(rounded, 2.0) != 0)) rounded += 1;
  return std::copysign(rounded * quantum, v);
}

double element_at(const Tensor& t, int64_t offset) {
  const void* base = t.data();
  switch (t.dtype()) {
    case DType::bf16:
      return decode_bf16(static_cast<const uint16_t*>(base)[offset]);
    case DType::fp16:
      return decode_fp16(static_cast<const uint16_t*>(base)[offset]);
    case DType::fp32:
      return static_cast<const float*>(base)[offset];
    case DType::fp64:
      return static_cast<const double*>(base)[offset];
    case DType::fp8_e4m3:
      return decode_e4m3(static_cast<const uint8_t*>(base)[offset]);
    case DType::e8m0:
      return decode_e8m0(static_cast<const uint8_t*>(base)[offset]);
    case DType::int8:
      return static_cast<const int8_t*>(base)[offset];
    case DType::int32:
      return static_cast<const int32_t*>(base)[offset];
    case DType::int64:
      return static_cast<double>(static_cast<const int64_t*>(base)[offset]);
    case DType::uint8:
      return static_cast<const uint8_t*>(base)[offset];
    case DType::fp8_e5m2:
      break;
  }
  MODMOE_FAIL() << "oracle::element_at: dtype " << dtype_name(t.dtype()) << " is not supported";
  return 0;
}

// ---- activation quantization emulation -------------------------------------------------------

namespace {

constexpr double kE4M3Max = 448.0;

// The library's dynamic fp8 scale, computed in float as the CPU quantizer does: 1 for an
// all-zero group, and the smallest positive float where amax / 448 underflows.
double dynamic_fp8_scale(double amax) {
  if (amax == 0) return 1.0;
  const float scale = static_cast<float>(amax) / 448.0f;
  return scale > 0 ? scale : std::numeric_limits<float>::denorm_min();
}

// OCP MX: 2^(floor(log2(amax)) - 8), 8 = the exponent of e4m3's largest power of two.
double mx_scale(double amax) {
  if (amax == 0) return std::ldexp(1.0, -127);
  const int exponent = std::ilogb(static_cast<float>(amax)) - 8;
  return std::ldexp(1.0, std::min(std::max(exponent, -127), 127));
}

double max_abs(const double* begin, int64_t count) {
  double amax = 0;
  for (int64_t i = 0; i < count; ++i) amax = std::max(amax, std::fabs(begin[i]));
  return amax;
}

void quantize_group(double* begin, int64_t count, double scale) {
  for (int64_t i = 0; i < count; ++i) begin[i] = round_to_e4m3(begin[i] / scale) * scale;
}

// fake_quantize on the (rows, cols) doubles at `data`.
void fake_quantize_rows(double* data, int64_t rows, int64_t cols, QuantScheme scheme,
                        double static_scale) {
  switch (scheme) {
    case QuantScheme::none:
      return;
    case QuantScheme::fp8_tensor: {
      const double scale =
          static_scale > 0 ? static_scale : dynamic_fp8_scale(max_abs(data, rows * cols));
      quantize_group(data, rows * cols, scale);
      return;
    }
    case QuantScheme::fp8_token:
    case QuantScheme::fp8_block:
    case QuantScheme::mxfp8: {
      const int64_t group = scale_group_k(scheme, cols);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c0 = 0; c0 < cols; c0 += group) {
          double* begin = data + r * cols + c0;
          const int64_t count = std::min(group, cols - c0);
          const double amax = max_abs(begin, count);
          quantize_group(begin, count,
                         scheme == QuantScheme::mxfp8 ? mx_scale(amax) : dynamic_fp8_scale(amax));
        }
      }
      return;
    }
  }
}

}  // namespace

void fake_quantize(std::vector<double>& data, int64_t rows, int64_t cols, QuantScheme scheme,
                   double static_scale) {
  MODMOE_CHECK(static_cast<int64_t>(data.size()) == rows * cols)
      << "oracle::fake_quantize: data must hold rows * cols = " << rows * cols << " elements, got "
      << data.size();
  MODMOE_CHECK(static_scale == 0 || scheme == QuantScheme::fp8_tensor)
      << "oracle::fake_quantize: a static scale is only defined for fp8-tensor, got "
      << quant_scheme_name(scheme);
  fake_quantize_rows(data.data(), rows, cols, scheme, static_scale);
}

// ---- the layer -------------------------------------------------------------------------------

namespace {

void check_host(const Tensor& t, const char* name) {
  MODMOE_CHECK(t.defined() && t.device().is_cpu())
      << "oracle: " << name << " must be a host tensor, got " << t.describe();
}

int64_t index_at(const Tensor& t, int64_t offset) {
  return t.dtype() == DType::int64 ? static_cast<const int64_t*>(t.data())[offset]
                                   : static_cast<const int32_t*>(t.data())[offset];
}

// Global expert id -> local expert (or -1). An undefined map is the identity.
int64_t local_expert(const Tensor& expert_map, int64_t global) {
  if (!expert_map.defined()) return global;
  return index_at(expert_map, global * expert_map.stride(0));
}

struct Dims {
  int64_t M = 0, K = 0, N = 0, rows13 = 0, topk = 0;
  int64_t num_local = 0, num_global = 0;
  bool gated = true;
};

void check_scale(const Tensor& scale, QuantScheme scheme, const Shape& expected, const char* name) {
  check_host(scale, name);
  MODMOE_CHECK(scale.dtype() == scale_dtype(scheme) && scale.shape() == expected)
      << "oracle: " << name << " must be " << dtype_name(scale_dtype(scheme)) << " "
      << shape_str(expected) << " for " << quant_scheme_name(scheme) << ", got "
      << scale.describe();
}

Dims validate(const OracleInputs& in) {
  Dims d;
  const ExpertWeights& w = in.weights;
  check_host(in.hidden_states, "hidden_states");
  MODMOE_CHECK(in.hidden_states.ndim() == 2 && is_float_dtype(in.hidden_states.dtype()))
      << "oracle: hidden_states must be a float (M, K) tensor, got " << in.hidden_states.describe();
  d.M = in.hidden_states.size(0);
  d.K = in.hidden_states.size(1);
  check_host(in.topk_ids, "topk_ids");
  MODMOE_CHECK(in.topk_ids.ndim() == 2 && is_index_dtype(in.topk_ids.dtype()) &&
               in.topk_ids.size(0) == d.M)
      << "oracle: topk_ids must be int32/int64 (M, topk) with M = " << d.M << ", got "
      << in.topk_ids.describe();
  d.topk = in.topk_ids.size(1);
  check_host(in.topk_weights, "topk_weights");
  MODMOE_CHECK(in.topk_weights.ndim() == 2 && is_float_dtype(in.topk_weights.dtype()) &&
               in.topk_weights.shape() == in.topk_ids.shape())
      << "oracle: topk_weights must be float " << in.topk_ids.shape_str() << ", got "
      << in.topk_weights.describe();
  MODMOE_CHECK(!in.apply_router_weight_on_input || d.topk == 1)
      << "oracle: apply_router_weight_on_input requires topk == 1, got topk = " << d.topk;

  check_host(w.w13, "w13");
  check_host(w.w2, "w2");
  MODMOE_CHECK(w.w2.ndim() == 3 && w.w2.size(1) == d.K)
      << "oracle: w2 must be (E_local, K, N) with K = " << d.K << ", got " << w.w2.describe();
  d.num_local = w.w2.size(0);
  d.N = w.w2.size(2);
  d.gated = is_gated(in.activation);
  d.rows13 = d.gated ? 2 * d.N : d.N;
  MODMOE_CHECK(w.w13.ndim() == 3 && w.w13.shape() == Shape({d.num_local, d.rows13, d.K}))
      << "oracle: w13 must be " << shape_str({d.num_local, d.rows13, d.K}) << " for "
      << activation_name(in.activation) << ", got " << w.w13.describe();

  const QuantScheme scheme = in.quant.scheme;
  if (in.quant.quantized()) {
    MODMOE_CHECK(w.w13.dtype() == DType::fp8_e4m3 && w.w2.dtype() == DType::fp8_e4m3)
        << "oracle: quantized weights must be fp8_e4m3, got w13 " << w.w13.describe() << ", w2 "
        << w.w2.describe();
    check_scale(w.w13_scale, scheme, weight_scale_shape(scheme, d.num_local, d.rows13, d.K),
                "w13_scale");
    check_scale(w.w2_scale, scheme, weight_scale_shape(scheme, d.num_local, d.K, d.N), "w2_scale");
  } else {
    MODMOE_CHECK(is_float_dtype(w.w13.dtype()) && is_float_dtype(w.w2.dtype()))
        << "oracle: unquantized weights must be bf16/fp16/fp32/fp64, got w13 " << w.w13.describe()
        << ", w2 " << w.w2.describe();
  }
  if (in.quant.static_act_scale) {
    MODMOE_CHECK(scheme == QuantScheme::fp8_tensor)
        << "oracle: static activation scales are only defined for fp8-tensor, got "
        << in.quant.str();
    check_scale(w.a13_scale, scheme, {1}, "a13_scale");
    check_scale(w.a2_scale, scheme, {1}, "a2_scale");
  }

  if (in.expert_map.defined()) {
    check_host(in.expert_map, "expert_map");
    MODMOE_CHECK(in.expert_map.ndim() == 1 && is_index_dtype(in.expert_map.dtype()))
        << "oracle: expert_map must be int32 (E), got " << in.expert_map.describe();
    d.num_global = in.expert_map.size(0);
    for (int64_t g = 0; g < d.num_global; ++g) {
      const int64_t local = local_expert(in.expert_map, g);
      MODMOE_CHECK(local >= -1 && local < d.num_local)
          << "oracle: expert_map[" << g << "] must be -1 or a local expert in [0, " << d.num_local
          << "), got " << local;
    }
  } else {
    d.num_global = d.num_local;
  }
  for (int64_t t = 0; t < d.M; ++t) {
    for (int64_t k = 0; k < d.topk; ++k) {
      const int64_t id =
          index_at(in.topk_ids, t * in.topk_ids.stride(0) + k * in.topk_ids.stride(1));
      MODMOE_CHECK(id >= 0 && id < d.num_global)
          << "oracle: topk_ids[" << t << ", " << k << "] must be in [0, " << d.num_global
          << "), got " << id;
    }
  }
  return d;
}

// One (token, k) pair routed to a local expert: a row of the intermediate.
struct RoutedPair {
  int64_t token;
  int64_t expert;  // local
  double weight;   // the factor applied to the expert's output
};

// The routed local pairs in (token, k) order.
std::vector<RoutedPair> routed_pairs(const OracleInputs& in, const Dims& d) {
  std::vector<RoutedPair> pairs;
  const Tensor& ids = in.topk_ids;
  const Tensor& weights = in.topk_weights;
  for (int64_t t = 0; t < d.M; ++t) {
    for (int64_t k = 0; k < d.topk; ++k) {
      const int64_t local =
          local_expert(in.expert_map, index_at(ids, t * ids.stride(0) + k * ids.stride(1)));
      if (local < 0) continue;
      const double w = in.apply_router_weight_on_input
                           ? 1.0
                           : element_at(weights, t * weights.stride(0) + k * weights.stride(1));
      pairs.push_back({t, local, w});
    }
  }
  return pairs;
}

// For each local expert, the indices of its pairs (so each expert's weights are decoded once).
std::vector<std::vector<int64_t>> pairs_by_expert(const std::vector<RoutedPair>& pairs,
                                                  int64_t num_local) {
  std::vector<std::vector<int64_t>> groups(num_local);
  for (size_t p = 0; p < pairs.size(); ++p) groups[pairs[p].expert].push_back(p);
  return groups;
}

// The scale of weight element (e, r, c) of an (E, R, C) weight tensor, per quant.h's table.
double scale_of(const Tensor& scale, QuantScheme scheme, int64_t e, int64_t r, int64_t c) {
  switch (scheme) {
    case QuantScheme::none:
      return 1.0;
    case QuantScheme::fp8_tensor:
      return element_at(scale, e * scale.stride(0));
    case QuantScheme::fp8_token:
      return element_at(scale, e * scale.stride(0) + r * scale.stride(1));
    case QuantScheme::fp8_block:
      return element_at(scale, e * scale.stride(0) + (r / kBlockSize) * scale.stride(1) +
                                   (c / kBlockSize) * scale.stride(2));
    case QuantScheme::mxfp8:
      return element_at(
          scale, e * scale.stride(0) + r * scale.stride(1) + (c / kMxBlockSize) * scale.stride(2));
  }
  return 1.0;
}

// Expert e of w (E, R, C) as a dense row-major (R, C) double matrix.
std::vector<double> dequantize_expert(const Tensor& w, const Tensor& scale, QuantScheme scheme,
                                      int64_t e) {
  // Every e4m3 code's value, decoded once (the weights are the bulk of the oracle's reads).
  static const std::vector<double> kE4M3Values = [] {
    std::vector<double> values(256);
    for (int code = 0; code < 256; ++code) values[code] = decode_e4m3(static_cast<uint8_t>(code));
    return values;
  }();
  const int64_t R = w.size(1), C = w.size(2);
  const int64_t s1 = w.stride(1), s2 = w.stride(2);
  const int64_t base = e * w.stride(0);
  // Columns one scale covers, and the scales of the current row (one per column group).
  const int64_t group =
      scheme == QuantScheme::none ? std::max<int64_t>(C, 1) : scale_group_k(scheme, C);
  std::vector<double> row_scales((C + group - 1) / group);
  std::vector<double> out(static_cast<size_t>(R * C));
  const bool fp8 = w.dtype() == DType::fp8_e4m3;
  const uint8_t* codes = static_cast<const uint8_t*>(w.data());
  for (int64_t r = 0; r < R; ++r) {
    for (size_t g = 0; g < row_scales.size(); ++g)
      row_scales[g] = scale_of(scale, scheme, e, r, static_cast<int64_t>(g) * group);
    double* row = out.data() + r * C;
    for (int64_t c = 0; c < C; ++c) {
      const int64_t offset = base + r * s1 + c * s2;
      row[c] = (fp8 ? kE4M3Values[codes[offset]] : element_at(w, offset)) * row_scales[c / group];
    }
  }
  return out;
}

// sum a[i] * b[i], with four partial sums so the loop is not bound by the add latency.
double dot(const double* a, const double* b, int64_t n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < n; ++i) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}

// Threads are worth their start-up only for large problems: the tests run many tiny ones on
// a shared 2-core machine, where a parallel region can cost milliseconds.
bool parallel_worth_it(const Dims& d, size_t num_pairs) {
  const double multiply_adds = static_cast<double>(num_pairs) * (d.rows13 + d.K) * d.N;
  return multiply_adds > 1e7;
}

double static_scale(const Tensor& scale) { return element_at(scale, 0); }

// GEMM1's input (M, K): x, times the router weight when applied on the input, quantized.
std::vector<double> gemm1_input(const OracleInputs& in, const Dims& d) {
  const Tensor& x = in.hidden_states;
  std::vector<double> a(static_cast<size_t>(d.M * d.K));
  for (int64_t t = 0; t < d.M; ++t) {
    const double factor = in.apply_router_weight_on_input
                              ? element_at(in.topk_weights, t * in.topk_weights.stride(0))
                              : 1.0;
    for (int64_t c = 0; c < d.K; ++c)
      a[t * d.K + c] = factor * element_at(x, t * x.stride(0) + c * x.stride(1));
  }
  if (in.emulate_quantization && in.quant.quantized())
    fake_quantize(a, d.M, d.K, in.quant.scheme,
                  in.quant.static_act_scale ? static_scale(in.weights.a13_scale) : 0);
  return a;
}

// The intermediate act(GEMM1) (pairs, N), before its quantization.
std::vector<double> intermediate(const OracleInputs& in, const Dims& d,
                                 const std::vector<RoutedPair>& pairs) {
  const std::vector<double> a = gemm1_input(in, d);
  std::vector<double> act(pairs.size() * static_cast<size_t>(d.N));
  const auto groups = pairs_by_expert(pairs, d.num_local);
  std::vector<double> h(static_cast<size_t>(d.rows13));
#pragma omp parallel for schedule(dynamic, 1) \
    firstprivate(h) if (parallel_worth_it(d, pairs.size()))
  for (int64_t e = 0; e < d.num_local; ++e) {
    const std::vector<int64_t>& group = groups[e];
    if (group.empty()) continue;
    const std::vector<double> w13 =
        dequantize_expert(in.weights.w13, in.weights.w13_scale, in.quant.scheme, e);
    for (const int64_t p : group) {
      const double* x = a.data() + pairs[p].token * d.K;
      for (int64_t r = 0; r < d.rows13; ++r) h[r] = dot(w13.data() + r * d.K, x, d.K);
      double* out = act.data() + p * d.N;
      for (int64_t j = 0; j < d.N; ++j) {
        out[j] = d.gated ? activation_gated(in.activation, h[gate_column(in.layout, j, d.N)],
                                            h[up_column(in.layout, j, d.N)])
                         : activation_gate(in.activation, h[j]);
      }
    }
  }
  return act;
}

}  // namespace

double intermediate_amax(const OracleInputs& in) {
  const Dims d = validate(in);
  const std::vector<double> act = intermediate(in, d, routed_pairs(in, d));
  return max_abs(act.data(), static_cast<int64_t>(act.size()));
}

std::vector<double> moe_forward(const OracleInputs& in) {
  const Dims d = validate(in);
  const std::vector<RoutedPair> pairs = routed_pairs(in, d);
  const int64_t P = static_cast<int64_t>(pairs.size());
  std::vector<double> act = intermediate(in, d, pairs);
  if (in.emulate_quantization && in.quant.quantized()) {
    // Pairs are in token order, so each chunk of tokens is a contiguous run of rows.
    const double a2 = in.quant.static_act_scale ? static_scale(in.weights.a2_scale) : 0;
    const int64_t chunk = in.chunk_size > 0 ? in.chunk_size : std::max<int64_t>(d.M, 1);
    for (int64_t begin = 0; begin < P;) {
      int64_t end = begin;
      const int64_t chunk_index = pairs[begin].token / chunk;
      while (end < P && pairs[end].token / chunk == chunk_index) ++end;
      fake_quantize_rows(act.data() + begin * d.N, end - begin, d.N, in.quant.scheme, a2);
      begin = end;
    }
  }

  // GEMM2 per pair, then the weighted sum per token in k order (deterministic, race-free).
  std::vector<double> y(static_cast<size_t>(P * d.K));
  const auto groups = pairs_by_expert(pairs, d.num_local);
#pragma omp parallel for schedule(dynamic, 1) if (parallel_worth_it(d, pairs.size()))
  for (int64_t e = 0; e < d.num_local; ++e) {
    const std::vector<int64_t>& group = groups[e];
    if (group.empty()) continue;
    const std::vector<double> w2 =
        dequantize_expert(in.weights.w2, in.weights.w2_scale, in.quant.scheme, e);
    for (const int64_t p : group) {
      const double* a = act.data() + p * d.N;
      for (int64_t k = 0; k < d.K; ++k) y[p * d.K + k] = dot(w2.data() + k * d.N, a, d.N);
    }
  }
  std::vector<double> out(static_cast<size_t>(d.M * d.K), 0.0);
  for (int64_t p = 0; p < P; ++p) {
    double* row = out.data() + pairs[p].token * d.K;
    for (int64_t k = 0; k < d.K; ++k) row[k] += pairs[p].weight * y[p * d.K + k];
  }
  return out;
}

// ---- comparison ------------------------------------------------------------------------------

namespace {

double relative(double diff_sq, double ref_sq) {
  if (ref_sq > 0) return std::sqrt(diff_sq / ref_sq);
  return diff_sq == 0 ? 0.0 : HUGE_VAL;
}

}  // namespace

bool ErrorReport::passed(double tol) const {
  return all_finite && rel_error <= tol && max_expert_rel_error <= tol;
}

std::string ErrorReport::str() const {
  char buf[256];
  if (!all_finite) {
    const int64_t cols = std::max<int64_t>(row_length, 1);
    std::snprintf(buf, sizeof(buf), "non-finite at %lld (row %lld, col %lld): %g; %lld in total",
                  static_cast<long long>(first_non_finite),
                  static_cast<long long>(first_non_finite / cols),
                  static_cast<long long>(first_non_finite % cols), first_non_finite_value,
                  static_cast<long long>(num_non_finite));
  } else if (worst_expert < 0) {
    std::snprintf(buf, sizeof(buf), "rel %.1e, no routed local expert", rel_error);
  } else {
    std::snprintf(buf, sizeof(buf), "rel %.1e, worst expert %lld: %.1e", rel_error,
                  static_cast<long long>(worst_expert), max_expert_rel_error);
  }
  return buf;
}

ErrorReport compare(const Tensor& out, const std::vector<double>& ref, const Tensor& topk_ids,
                    const Tensor& expert_map) {
  check_host(out, "out");
  MODMOE_CHECK(out.ndim() == 2 && is_float_dtype(out.dtype()))
      << "oracle::compare: out must be a float (M, K) tensor, got " << out.describe();
  const int64_t M = out.size(0), K = out.size(1);
  MODMOE_CHECK(static_cast<int64_t>(ref.size()) == M * K)
      << "oracle::compare: ref must hold M * K = " << M * K << " values, got " << ref.size();
  check_host(topk_ids, "topk_ids");
  MODMOE_CHECK(topk_ids.ndim() == 2 && is_index_dtype(topk_ids.dtype()) && topk_ids.size(0) == M)
      << "oracle::compare: topk_ids must be int32/int64 (M, topk) with M = " << M << ", got "
      << topk_ids.describe();
  if (expert_map.defined()) check_host(expert_map, "expert_map");

  ErrorReport report;
  report.row_length = K;
  std::vector<double> row_diff_sq(static_cast<size_t>(M), 0.0), row_ref_sq(M, 0.0);
  for (int64_t t = 0; t < M; ++t) {
    for (int64_t k = 0; k < K; ++k) {
      const double v = element_at(out, t * out.stride(0) + k * out.stride(1));
      if (!std::isfinite(v)) {
        if (report.all_finite) {
          report.first_non_finite = t * K + k;
          report.first_non_finite_value = v;
        }
        report.all_finite = false;
        ++report.num_non_finite;
        continue;
      }
      const double r = ref[t * K + k];
      row_diff_sq[t] += (v - r) * (v - r);
      row_ref_sq[t] += r * r;
    }
  }
  if (!report.all_finite) {
    report.rel_error = report.max_expert_rel_error = HUGE_VAL;
    return report;
  }

  // Per expert: the rows of the tokens routed to it (each token once per expert).
  const int64_t topk = topk_ids.size(1);
  auto id_at = [&](int64_t t, int64_t k) {
    return index_at(topk_ids, t * topk_ids.stride(0) + k * topk_ids.stride(1));
  };
  int64_t num_global = 0;  // the map's E, or (without a map) enough for every id
  if (expert_map.defined()) {
    MODMOE_CHECK(expert_map.ndim() == 1 && is_index_dtype(expert_map.dtype()))
        << "oracle::compare: expert_map must be int32 (E), got " << expert_map.describe();
    num_global = expert_map.size(0);
  } else {
    for (int64_t t = 0; t < M; ++t)
      for (int64_t k = 0; k < topk; ++k) num_global = std::max(num_global, id_at(t, k) + 1);
  }
  std::vector<double> expert_diff_sq(num_global, 0.0), expert_ref_sq(num_global, 0.0);
  std::vector<bool> expert_routed(num_global, false);
  double diff_sq = 0, ref_sq = 0;
  for (int64_t t = 0; t < M; ++t) {
    diff_sq += row_diff_sq[t];
    ref_sq += row_ref_sq[t];
    for (int64_t k = 0; k < topk; ++k) {
      const int64_t g = id_at(t, k);
      MODMOE_CHECK(g >= 0 && g < num_global) << "oracle::compare: topk_ids[" << t << ", " << k
                                             << "] must be in [0, " << num_global << "), got " << g;
      bool seen = false;  // a token counts once per expert even if its row repeats the id
      for (int64_t j = 0; j < k; ++j) seen = seen || id_at(t, j) == g;
      if (seen || local_expert(expert_map, g) < 0) continue;
      expert_diff_sq[g] += row_diff_sq[t];
      expert_ref_sq[g] += row_ref_sq[t];
      expert_routed[g] = true;
    }
  }
  report.rel_error = relative(diff_sq, ref_sq);
  for (int64_t g = 0; g < num_global; ++g) {
    if (!expert_routed[g]) continue;
    const double rel = relative(expert_diff_sq[g], expert_ref_sq[g]);
    if (report.worst_expert < 0 || rel > report.max_expert_rel_error) {
      report.max_expert_rel_error = rel;
      report.worst_expert = g;
    }
  }
  return report;
}

}  // namespace oracle
}  // namespace modmoe
