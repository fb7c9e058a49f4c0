// Random MoE problems (see problem.h). Every tensor draws from its own random stream, derived
// from the seed and a fixed tag, so e.g. the weights do not change when only M does.
#include "oracle/problem.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <vector>

#include "modmoe/context.h"
#include "modmoe/error.h"
#include "modmoe/numeric.h"
#include "modmoe/quant.h"

namespace modmoe {
namespace testing {

namespace {

// splitmix64's output function: a bijective 64-bit mix.
uint64_t mix(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// SplitMix64 (Steele, Lea, Flood 2014): tiny, fast and fully specified, so problems are the
// same on every platform and standard library (std::normal_distribution is not). Streams
// for (seed, tag, block) start from well-separated states.
class Rng {
 public:
  Rng(uint64_t seed, uint64_t tag, uint64_t block = 0)
      : state_(mix(mix(mix(seed + kGolden) ^ tag) + block * kGolden)) {}
  uint64_t next() {
    state_ += kGolden;
    return mix(state_);
  }
  // [0, 1) from the top 53 bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  // Marsaglia's polar method: two normals per accepted point, no trigonometry.
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u, v, s;
    do {
      u = 2.0 * uniform() - 1.0;
      v = 2.0 * uniform() - 1.0;
      s = u * u + v * v;
    } while (s >= 1.0 || s == 0.0);
    const double factor = std::sqrt(-2.0 * std::log(s) / s);
    spare_ = v * factor;
    has_spare_ = true;
    return u * factor;
  }
  int64_t below(int64_t n) { return static_cast<int64_t>(uniform() * static_cast<double>(n)); }

 private:
  static constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;
  uint64_t state_;
  double spare_ = 0;
  bool has_spare_ = false;
};

enum StreamTag : uint64_t {
  kHiddenStream = 1,
  kRoutingStream,
  kRouterWeightStream,
  kExpertMapStream,
  kW13Stream,
  kW2Stream,
};

// A host fp32 tensor of N(0,1) * std from stream `tag`. Blocks of elements draw from their own
// sub-streams, so the values do not depend on the number of threads that fill them.
OwnedTensor normal_fp32(const Shape& shape, double std, uint64_t seed, uint64_t tag) {
  constexpr int64_t kBlock = 4096;
  OwnedTensor t = host_tensor(DType::fp32, shape);
  float* p = t.data_ptr<float>();
  const int64_t numel = t.tensor().numel();
  const int64_t blocks = (numel + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (blocks > 16)
  for (int64_t b = 0; b < blocks; ++b) {
    Rng rng(seed, tag, static_cast<uint64_t>(b));
    for (int64_t i = b * kBlock; i < std::min(numel, (b + 1) * kBlock); ++i)
      p[i] = static_cast<float>(rng.normal() * std);
  }
  return t;
}

OwnedTensor convert(const Tensor& src, DType dtype) {
  OwnedTensor t = host_tensor(dtype, src.shape());
  const float* from = src.data_ptr<float>();
  void* to = t.tensor().data();
  const int64_t numel = src.numel();
#pragma omp parallel for schedule(static) if (numel > (1 << 20))
  for (int64_t i = 0; i < numel; ++i) store_float(to, dtype, i, from[i]);
  return t;
}

// Codes and scales of expert weights w (E, R, C) fp32; stored in `q` and `scale`.
void quantize_expert_weights(const Tensor& w, QuantScheme scheme, OwnedTensor& q,
                             OwnedTensor& scale) {
  q = host_tensor(quantized_dtype(scheme), w.shape());
  scale =
      host_tensor(scale_dtype(scheme), weight_scale_shape(scheme, w.size(0), w.size(1), w.size(2)));
  quantize_weights(Context::cpu(), w, scheme, q, scale);
}

double max_abs_elements(const Tensor& t) {
  double amax = 0;
  for (int64_t i = 0; i < t.numel(); ++i)
    amax = std::max(amax, std::fabs(oracle::element_at(t, i)));
  return amax;
}

// A static scale fp32 (1) that maps amax to e4m3's 448, as a calibration would.
OwnedTensor static_scale_for(double amax) {
  OwnedTensor s = host_tensor(DType::fp32, {1});
  s.data_ptr<float>()[0] = amax > 0 ? static_cast<float>(amax) / kE4M3Max : 1.0f;
  return s;
}

void validate(const ProblemSpec& spec) {
  const MoEConfig& c = spec.config;
  MODMOE_CHECK(c.num_experts > 0 && c.hidden_size > 0 && c.intermediate_size > 0 && spec.M >= 0)
      << "make_problem: E, K, N must be > 0 and M >= 0, got " << spec.str();
  MODMOE_CHECK(c.topk >= 1 && c.topk <= c.num_experts)
      << "make_problem: topk must be in [1, E = " << c.num_experts << "], got " << c.topk;
  MODMOE_CHECK(c.in_dtype == DType::bf16 || c.in_dtype == DType::fp16 || c.in_dtype == DType::fp32)
      << "make_problem: in_dtype must be bf16/fp16/fp32, got " << dtype_name(c.in_dtype);
  if (spec.use_expert_map) {
    MODMOE_CHECK(c.num_local_experts >= 1 && c.num_local_experts <= c.num_experts)
        << "make_problem: with an expert map, num_local_experts must be in [1, E = "
        << c.num_experts << "], got " << c.num_local_experts;
  } else {
    MODMOE_CHECK(c.num_local_experts == 0 || c.num_local_experts == c.num_experts)
        << "make_problem: without an expert map, num_local_experts must equal E = " << c.num_experts
        << " (or be 0), got " << c.num_local_experts;
  }
  MODMOE_CHECK(!spec.apply_router_weight_on_input || c.topk == 1)
      << "make_problem: apply_router_weight_on_input requires topk == 1, got " << c.topk;
  MODMOE_CHECK(!c.quant.static_act_scale || c.quant.scheme == QuantScheme::fp8_tensor)
      << "make_problem: static activation scales exist for fp8-tensor only, got " << c.quant.str();
}

}  // namespace

std::string ProblemSpec::str() const {
  std::ostringstream s;
  s << "M=" << M << " seed=" << seed << " " << config.str();
  if (int64_ids) s << " ids=int64";
  if (use_expert_map) s << " expert_map";
  if (apply_router_weight_on_input) s << " router_weight_on_input";
  return s.str();
}

ExpertWeights Problem::weights() const {
  ExpertWeights w;
  w.w13 = w13;
  w.w2 = w2;
  w.w13_scale = w13_scale;
  w.w2_scale = w2_scale;
  w.a13_scale = a13_scale;
  w.a2_scale = a2_scale;
  return w;
}

ForwardArgs Problem::forward_args() const {
  ForwardArgs a;
  a.hidden_states = hidden_states;
  a.topk_weights = topk_weights;
  a.topk_ids = topk_ids;
  a.output = output;
  a.weights = weights();
  a.expert_map = expert_map;
  a.apply_router_weight_on_input = spec.apply_router_weight_on_input;
  return a;
}

ProblemSpec simple_spec(int64_t M, int64_t topk, int64_t E, int64_t K, int64_t N, DType dtype,
                        QuantScheme scheme, uint64_t seed) {
  ProblemSpec s;
  s.config.num_experts = E;
  s.config.num_local_experts = E;
  s.config.hidden_size = K;
  s.config.intermediate_size = N;
  s.config.topk = topk;
  s.config.in_dtype = dtype;
  s.config.quant.scheme = scheme;
  s.config.max_num_tokens = M;
  s.M = M;
  s.seed = seed;
  return s;
}

oracle::OracleInputs Problem::oracle_inputs() const {
  oracle::OracleInputs in;
  in.hidden_states = hidden_states;
  in.topk_weights = topk_weights;
  in.topk_ids = topk_ids;
  in.weights = weights();
  in.expert_map = expert_map;
  in.quant = spec.config.quant;
  in.activation = spec.config.activation;
  in.layout = spec.config.gated_layout;
  in.apply_router_weight_on_input = spec.apply_router_weight_on_input;
  in.emulate_quantization = true;
  return in;
}

Problem make_problem(const ProblemSpec& spec) {
  validate(spec);
  Problem p;
  p.spec = spec;
  MoEConfig& c = p.spec.config;
  if (c.num_local_experts == 0) c.num_local_experts = c.num_experts;
  const int64_t M = spec.M, K = c.hidden_size, N = c.intermediate_size, E = c.num_experts;
  const int64_t E_local = c.num_local_experts, topk = c.topk;
  const QuantScheme scheme = c.quant.scheme;
  const Context ctx = Context::cpu();

  // Expert map: a random subset of the global experts is local, numbered in random order.
  if (spec.use_expert_map) {
    Rng rng(spec.seed, kExpertMapStream);
    std::vector<int64_t> order(E);
    for (int64_t g = 0; g < E; ++g) order[g] = g;
    for (int64_t i = E - 1; i > 0; --i) std::swap(order[i], order[rng.below(i + 1)]);
    p.expert_map = host_tensor(DType::int32, {E});
    int32_t* map = p.expert_map.data_ptr<int32_t>();
    std::fill(map, map + E, -1);
    for (int64_t local = 0; local < E_local; ++local)
      map[order[local]] = static_cast<int32_t>(local);
  }

  // Routing: topk distinct ids per row (a partial Fisher-Yates shuffle).
  {
    Rng rng(spec.seed, kRoutingStream);
    p.topk_ids = host_tensor(spec.int64_ids ? DType::int64 : DType::int32, {M, topk});
    std::vector<int64_t> experts(E);
    for (int64_t t = 0; t < M; ++t) {
      for (int64_t g = 0; g < E; ++g) experts[g] = g;
      for (int64_t k = 0; k < topk; ++k) {
        std::swap(experts[k], experts[k + rng.below(E - k)]);
        if (spec.int64_ids)
          p.topk_ids.data_ptr<int64_t>()[t * topk + k] = experts[k];
        else
          p.topk_ids.data_ptr<int32_t>()[t * topk + k] = static_cast<int32_t>(experts[k]);
      }
    }
  }
  {
    Rng rng(spec.seed, kRouterWeightStream);
    p.topk_weights = host_tensor(DType::fp32, {M, topk});
    float* w = p.topk_weights.data_ptr<float>();
    std::vector<double> logits(topk);
    for (int64_t t = 0; t < M; ++t) {
      if (spec.apply_router_weight_on_input) {
        w[t] = static_cast<float>(0.25 + 0.75 * rng.uniform());
        continue;
      }
      double sum = 0;
      for (int64_t k = 0; k < topk; ++k) sum += logits[k] = std::exp(rng.normal());
      for (int64_t k = 0; k < topk; ++k) w[t * topk + k] = static_cast<float>(logits[k] / sum);
    }
  }

  // Hidden states, pre-rounded through the scheme's activation quantization.
  {
    const OwnedTensor x = normal_fp32({M, K}, 1.0, spec.seed, kHiddenStream);
    if (c.quant.quantized() && M > 0) {
      const OwnedTensor q = host_tensor(quantized_dtype(scheme), {M, K});
      const OwnedTensor scale = host_tensor(scale_dtype(scheme), act_scale_shape(scheme, M, K));
      quantize_activations(ctx, x, scheme, /*static_scale=*/false, q, scale);
      p.hidden_states = host_tensor(c.in_dtype, {M, K});
      dequantize_activations(ctx, q, scale, scheme, p.hidden_states);
    } else {
      p.hidden_states = convert(x, c.in_dtype);
    }
  }

  // Expert weights ~ N(0, 1/fan_in).
  {
    const OwnedTensor w13 =
        normal_fp32({E_local, c.w13_rows(), K}, 1.0 / std::sqrt(K), spec.seed, kW13Stream);
    const OwnedTensor w2 = normal_fp32({E_local, K, N}, 1.0 / std::sqrt(N), spec.seed, kW2Stream);
    if (c.quant.quantized()) {
      quantize_expert_weights(w13, scheme, p.w13, p.w13_scale);
      quantize_expert_weights(w2, scheme, p.w2, p.w2_scale);
    } else {
      p.w13 = convert(w13, c.in_dtype);
      p.w2 = convert(w2, c.in_dtype);
    }
  }

  // Static scales, as a calibration over this very batch would set them.
  if (c.quant.static_act_scale) {
    p.a13_scale = static_scale_for(max_abs_elements(p.hidden_states));
    p.a2_scale = static_scale_for(1.0);  // placeholder: the oracle needs a defined a2_scale
    p.a2_scale = static_scale_for(oracle::intermediate_amax(p.oracle_inputs()));
  }

  p.output = host_tensor(c.in_dtype, {M, K});
  poison(p.output);
  return p;
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  MODMOE_CHECK(t.defined() && t.device().is_cpu() && t.is_contiguous())
      << "bytes_of: t must be a contiguous host tensor, got " << t.describe();
  const auto* p = static_cast<const uint8_t*>(t.data());
  return std::vector<uint8_t>(p, p + t.nbytes());
}

void poison(const Tensor& t) {
  MODMOE_CHECK(t.defined() && t.device().is_cpu())
      << "poison: t must be a host tensor, got " << t.describe();
  uint64_t pattern = 0;  // the NaN bit pattern of the dtype, little-endian
  switch (t.dtype()) {
    case DType::bf16:
      pattern = 0x7fc0;
      break;
    case DType::fp16:
      pattern = 0x7e00;
      break;
    case DType::fp32:
      pattern = 0x7fc00000u;
      break;
    case DType::fp64:
      pattern = 0x7ff8000000000000ull;
      break;
    case DType::fp8_e4m3:
      pattern = 0x7f;
      break;
    case DType::fp8_e5m2:
      pattern = 0x7f;
      break;
    case DType::e8m0:
      pattern = 0xff;
      break;
    default:
      MODMOE_FAIL() << "poison: t must have a float, fp8 or e8m0 dtype, got " << t.describe();
  }
  const size_t bytes = dtype_size(t.dtype());
  const int ndim = t.ndim();
  const Shape shape = t.shape(), strides = t.strides();
  const int64_t numel = t.numel();
  for (int64_t flat = 0; flat < numel; ++flat) {
    int64_t offset = 0, rest = flat;
    for (int d = ndim - 1; d >= 0; --d) {
      offset += (rest % shape[d]) * strides[d];
      rest /= shape[d];
    }
    std::memcpy(static_cast<char*>(t.data()) + offset * static_cast<int64_t>(bytes), &pattern,
                bytes);
  }
}

OwnedTensor transpose_last_two(const Tensor& t) {
  const int64_t batch = t.ndim() == 3 ? t.size(0) : 1, R = t.size(-2), C = t.size(-1);
  OwnedTensor out = host_tensor(DType::fp32, t.ndim() == 3 ? Shape{batch, C, R} : Shape{C, R});
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c)
        out.data_ptr<float>()[(b * C + c) * R + r] = t.data_ptr<const float>()[(b * R + r) * C + c];
  return out;
}

}  // namespace testing
}  // namespace modmoe
