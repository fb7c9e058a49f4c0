// modmoe-bench: times the MoE layer through the ModularKernel.
//
//   modmoe-bench --demo                 Qwen3-30B-A3B layer, M = 64, bf16, best backend present
//   modmoe-bench --model NAME [-m M] [--quant none|fp8-block|...] [--repeats R] [--no-check]
//   modmoe-bench --list-models
//
// Prints the median wall time of R forwards, the achieved GFLOP/s and weight GB/s, and the
// error against the float64 oracle (the oracle is skipped with --no-check).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "modmoe/modmoe.h"
#include "modmoe/numeric.h"
#include "oracle/oracle.h"

namespace {

using namespace modmoe;

// The standard shapes of ARCHITECTURE.md §10.
struct ModelShape {
  const char* name;
  int64_t E, topk, K, N;
  Activation activation;
};
const ModelShape kModels[] = {
    {"mixtral-8x7b", 8, 2, 4096, 14336, Activation::silu},
    {"qwen3-30b-a3b", 128, 8, 2048, 768, Activation::silu},
    {"qwen3.5-35b-a3b", 256, 8, 2048, 512, Activation::silu},
    {"deepseek-v3", 256, 8, 7168, 2048, Activation::silu},
    {"gpt-oss-120b", 128, 4, 2880, 2880, Activation::swigluoai},
};

[[noreturn]] void usage(int code) {
  std::printf(
      "usage: modmoe-bench --demo | --model NAME [-m M] [--dtype bf16|fp16|fp32]\n"
      "                    [--quant none|fp8-tensor|fp8-token|fp8-block|mxfp8] [--repeats R]\n"
      "                    [--seed S] [--no-check] | --list-models\n");
  std::exit(code);
}

// Fast, seedable, parallel fill: a hash of (seed, index) mapped to an approximately normal value
// (sum of two uniforms, centred). The 1.2 GB of Qwen3-30B-A3B weights fill in well under a second.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
void fill_random(const Tensor& t, uint64_t seed, float scale) {
  const int64_t n = t.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t h = mix(seed * 0x100000001b3ull + static_cast<uint64_t>(i));
    const float u1 = (h >> 40) * (1.0f / 16777216.0f), u2 = ((h >> 16) & 0xffffff) * (1.0f / 16777216.0f);
    store_float(t.data(), t.dtype(), i, (u1 + u2 - 1.0f) * 2.449f * scale);  // unit variance
  }
}

struct Weights {
  OwnedTensor w13, w2, w13_scale, w2_scale;
};

// Random weights for E experts, quantized per expert when the scheme asks (so the fp32 staging
// copy is one expert, not the whole layer).
OwnedTensor random_weight(int64_t E, int64_t rows, int64_t cols, const MoEConfig& c, uint64_t seed,
                          OwnedTensor* scale) {
  const float s = 1.0f / std::sqrt(static_cast<float>(cols));
  if (!c.quant.quantized()) {
    OwnedTensor w = host_tensor(c.in_dtype, {E, rows, cols});
    fill_random(w, seed, s);
    return w;
  }
  const QuantScheme q = c.quant.scheme;
  OwnedTensor w = host_tensor(DType::fp8_e4m3, {E, rows, cols});
  *scale = host_tensor(scale_dtype(q), weight_scale_shape(q, E, rows, cols));
  OwnedTensor staging = host_tensor(DType::fp32, {1, rows, cols});
  for (int64_t e = 0; e < E; ++e) {
    fill_random(staging, seed + e, s);
    quantize_weights(Context::cpu(), staging, q, w.tensor().slice(e, e + 1),
                     scale->tensor().slice(e, e + 1));
  }
  return w;
}

int run(const ModelShape& model, int64_t M, DType dtype, QuantConfig quant, int repeats,
        uint64_t seed, bool check) {
  MoEConfig c;
  c.num_experts = c.num_local_experts = model.E;
  c.topk = model.topk;
  c.hidden_size = model.K;
  c.intermediate_size = model.N;
  c.in_dtype = dtype;
  c.quant = quant;
  c.activation = model.activation;
  c.gated_layout = GatedLayout::GateUp;

  const Context ctx = Context::cpu();  // the best backend present in this build
  std::printf("modmoe-bench: %s  M=%lld  %s  backend=cpu (%d OpenMP threads)\n", model.name,
              static_cast<long long>(M), c.str().c_str(), omp_get_max_threads());

  // Inputs and routing: softmax top-k (renormalized) over random router logits.
  OwnedTensor x = host_tensor(dtype, {M, c.hidden_size});
  fill_random(x, seed, 1.0f);
  if (quant.quantized()) {  // pre-round x through the scheme, as the oracle comparison expects
    OwnedTensor q = host_tensor(DType::fp8_e4m3, {M, c.hidden_size});
    OwnedTensor s = host_tensor(scale_dtype(quant.scheme), act_scale_shape(quant.scheme, M, c.hidden_size));
    quantize_activations(ctx, x, quant.scheme, false, q, s);
    dequantize_activations(ctx, q, s, quant.scheme, x);
  }
  OwnedTensor logits = host_tensor(DType::fp32, {M, c.num_experts});
  fill_random(logits, seed + 1, 1.0f);
  OwnedTensor topk_w = host_tensor(DType::fp32, {M, c.topk});
  OwnedTensor topk_ids = host_tensor(DType::int32, {M, c.topk});
  softmax_topk(ctx, logits, c.topk, /*renormalize=*/true, topk_w, topk_ids);

  Weights w;
  w.w13 = random_weight(c.num_experts, c.w13_rows(), c.hidden_size, c, seed + 100, &w.w13_scale);
  w.w2 = random_weight(c.num_experts, c.hidden_size, c.intermediate_size, c, seed + 100000, &w.w2_scale);
  OwnedTensor out = host_tensor(dtype, {M, c.hidden_size});

  ModularKernel kernel = make_modular_kernel("NoEPPrepareAndFinalize", "auto", c);
  std::printf("parts: %s + %s\n", kernel.prepare_finalize().name().c_str(),
              kernel.experts().name().c_str());
  ForwardArgs args;
  args.hidden_states = x;
  args.topk_weights = topk_w;
  args.topk_ids = topk_ids;
  args.output = out;
  args.weights = {w.w13, w.w2, w.w13_scale, w.w2_scale, Tensor(), Tensor()};

  std::vector<double> times;
  for (int r = 0; r < repeats + 1; ++r) {  // the first run warms caches and page-faults buffers
    const auto t0 = std::chrono::steady_clock::now();
    kernel.forward(ctx, args);
    const auto t1 = std::chrono::steady_clock::now();
    if (r > 0) times.push_back(std::chrono::duration<double>(t1 - t0).count());
  }
  std::sort(times.begin(), times.end());
  const double t = times[times.size() / 2];

  // Work: every (token, k) pair does GEMM1 (w13_rows x K) and GEMM2 (K x N); weight bytes are
  // those of the experts that received at least one token.
  std::vector<char> hit(c.num_experts, 0);
  for (int64_t i = 0; i < M * c.topk; ++i) hit[topk_ids.data_ptr<int32_t>()[i]] = 1;
  const int64_t experts_hit = std::count(hit.begin(), hit.end(), 1);
  const double flops = 2.0 * M * c.topk * (c.w13_rows() * c.hidden_size + c.hidden_size * c.intermediate_size);
  const double weight_bytes = double(experts_hit) *
                              (c.w13_rows() * c.hidden_size + c.hidden_size * c.intermediate_size) *
                              dtype_size(w.w13.tensor().dtype());
  std::printf("time: %.2f ms (median of %d)  %.1f GFLOP/s  %.2f GB/s of weights (%lld experts hit)\n",
              t * 1e3, repeats, flops / t * 1e-9, weight_bytes / t * 1e-9,
              static_cast<long long>(experts_hit));

  if (!check) return 0;
  oracle::OracleInputs in;
  in.hidden_states = x;
  in.topk_weights = topk_w;
  in.topk_ids = topk_ids;
  in.weights = args.weights;
  in.quant = quant;
  in.activation = c.activation;
  in.layout = c.gated_layout;
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<double> ref = oracle::moe_forward(in);
  const double oracle_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const oracle::ErrorReport err = oracle::compare(out, ref, topk_ids, Tensor());
  const double tol = quant.quantized() ? 3e-2 : (dtype == DType::fp32 ? 1e-4 : 1e-2);
  const bool ok = err.passed(tol);
  std::printf("error vs float64 oracle: %s  (tolerance %.0e, oracle %.1f s): %s\n",
              err.str().c_str(), tol, oracle_s, ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string model = "qwen3-30b-a3b";
    int64_t M = 64;
    DType dtype = DType::bf16;
    QuantConfig quant;
    int repeats = 5;
    uint64_t seed = 1;
    bool check = true, any = false;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto next = [&]() -> std::string {
        if (i + 1 >= argc) {
          std::fprintf(stderr, "modmoe-bench: %s needs a value\n", a.c_str());
          usage(2);
        }
        return argv[++i];
      };
      if (a == "--demo") any = true;
      else if (a == "--model") model = next(), any = true;
      else if (a == "-m") M = std::stoll(next());
      else if (a == "--dtype") dtype = parse_dtype(next());
      else if (a == "--quant") quant.scheme = parse_quant_scheme(next());
      else if (a == "--repeats") repeats = std::max(1, std::stoi(next()));
      else if (a == "--seed") seed = std::stoull(next());
      else if (a == "--no-check") check = false;
      else if (a == "--list-models") {
        for (const auto& m : kModels)
          std::printf("%-16s E=%lld topk=%lld K=%lld N=%lld %s\n", m.name, (long long)m.E,
                      (long long)m.topk, (long long)m.K, (long long)m.N, activation_name(m.activation));
        return 0;
      } else if (a == "-h" || a == "--help") usage(0);
      else {
        std::fprintf(stderr, "modmoe-bench: unknown argument '%s'\n", a.c_str());
        usage(2);
      }
    }
    if (!any) usage(2);
    for (const auto& m : kModels)
      if (model == m.name) return run(m, M, dtype, quant, repeats, seed, check);
    std::fprintf(stderr, "modmoe-bench: unknown model '%s' (--list-models)\n", model.c_str());
    return 2;
  } catch (const modmoe::Error& e) {
    std::fprintf(stderr, "modmoe-bench: error: %s\n", e.what());
    return 2;
  }
}
