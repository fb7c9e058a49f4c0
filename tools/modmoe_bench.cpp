// modmoe-bench: times the MoE layer through the ModularKernel.
//
//   modmoe-bench --demo                 Qwen3-30B-A3B layer, M = 64, bf16, on the GPU when one is
//                                       present (else the CPU), checked against the oracle
//   modmoe-bench --model NAME [-m M] [--quant none|fp8-block|...] [--repeats R] [--no-check]
//   modmoe-bench --shapes standard|quick [--json FILE] [--stages] ...     (GPU only)
//   modmoe-bench --gemm [--json FILE] [--replays R] [--quick] [--models ..] [--rows ..]
//                [--decode-ms ..] [--gemm-dtypes ..]                      (Hopper GPU only)
//   modmoe-bench --list-models
//
// One model: the median time of R forwards (on the GPU: R replays of a captured CUDA graph),
// the achieved GFLOP/s and weight GB/s, and the error against the float64 oracle.
// --shapes: the standard shapes of ARCHITECTURE.md §10 against their floor and the cuBLAS
// baseline, measured in the same run (tools/bench_gpu.cu; docs/gpu.md explains the numbers).
// --gemm: the Hopper grouped GEMM alone: fused vs unfused gated FC1, the MoE scheduler at decode,
// GEMM-only roofline numbers (tools/bench_sm90.cu).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "bench_models.h"
#include "modmoe/cuda.h"
#include "modmoe/modmoe.h"
#include "modmoe/numeric.h"
#include "oracle/oracle.h"

#if MODMOE_WITH_CUDA
#include "bench_device.h"
#include "bench_gpu.h"
#include "bench_sm90.h"
#endif

namespace {

using namespace modmoe;
using bench::kModels;
using bench::ModelShape;

[[noreturn]] void usage(int code) {
  std::printf(
      "usage: modmoe-bench --demo [--cpu | --gpu]\n"
      "       modmoe-bench --model NAME [-m M] [--dtype bf16|fp16|fp32]\n"
      "                    [--quant none|fp8-tensor|fp8-token|fp8-block|mxfp8] [--repeats R]\n"
      "                    [--seed S] [--no-check] [--cpu | --gpu]\n"
      "       modmoe-bench --shapes standard|quick [--json FILE] [--stages] [--replays R]\n"
      "                    [--models a,b] [--ms 1,16] [--quants none,fp8-block] [--pf NAME]\n"
      "                    [--experts NAME] [--no-baseline] [--no-flush | --flush read|write]\n"
      "                    [--settle-ms MS] [--seed S] [--arena]\n"
      "       modmoe-bench --gemm [--json FILE] [--replays R] [--quick] [--seed S]\n"
      "                    [--no-flush | --flush read|write] [--settle-ms MS]\n"
      "                    [--models a,b] [--rows 1,64] [--decode-ms 1,2 | 0] [--gemm-dtypes fp8]\n"
      "       modmoe-bench --list-models\n"
      "\n"
      "--gpu is the default when a CUDA device is visible; --cpu forces the CPU backend.\n"
      "--shapes standard: 5 models x M in {1, 16, 128, 1024, 8192} x {bf16, fp8-block}, GPU only;\n"
      "--shapes quick (or --quick): qwen3-30b-a3b and deepseek-v3 x M in {1, 128, 8192}.\n"
      "--gemm: the Hopper (sm90) grouped GEMM alone on GPU 0: fused vs unfused gated FC1 for 3\n"
      "shapes x rows per expert {1, 64, 128, 256, 1024} x {bf16, fp8}, the scheduler A/B at\n"
      "decode (M in 1..64), roofline numbers; --quick: one shape, rows {1, 128}, M {1, 16}.\n"
      "--models/--rows/--decode-ms/--gemm-dtypes narrow --gemm to some cases (--decode-ms 0: no\n"
      "scheduler study), e.g. one case to profile under ncu.\n"
      "--flush: how the L2 is evicted before each timed replay: read (default; clean lines) or\n"
      "write (a memset, as before 2026-12-01: the timed kernels pay for its dirty lines).\n"
      "--settle-ms: idle time before each timing (default 300), so a case is not timed at the\n"
      "clock a compute-bound case before it left under the power cap; 0 turns it off.\n"
      "--arena: the forward's workspaces from an ArenaAllocator (sized by an eager forward)\n"
      "instead of the cudaMallocAsync pool, so the captured graph has no memory nodes.\n"
      "Skips (exit 0) where the Hopper kernel is not available.\n"
      "See docs/gpu.md.\n");
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
    const float u1 = (h >> 40) * (1.0f / 16777216.0f),
                u2 = ((h >> 16) & 0xffffff) * (1.0f / 16777216.0f);
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

// One model, one M: built on the host, run on the CPU or (copied) on GPU 0.
int run(const ModelShape& model, int64_t M, DType dtype, QuantConfig quant, int repeats,
        uint64_t seed, bool check, bool gpu) {
  const MoEConfig c = bench::model_config(model, dtype, quant);
  const Context ctx = Context::cpu();  // host-side preparation (and the CPU run)
#if MODMOE_WITH_CUDA
  const std::string where = gpu ? "cuda (" + bench::gpu_name() + ")" : "cpu";
#else
  const std::string where = "cpu";
#endif
  std::printf("modmoe-bench: %s  M=%lld  %s  backend=%s", model.name, static_cast<long long>(M),
              c.str().c_str(), where.c_str());
  if (!gpu) std::printf(" (%d OpenMP threads)", omp_get_max_threads());
  std::printf("\n");

  // Inputs and routing: the model's router over random logits.
  OwnedTensor x = host_tensor(dtype, {M, c.hidden_size});
  fill_random(x, seed, 1.0f);
  if (quant.quantized()) {  // pre-round x through the scheme, as the oracle comparison expects
    OwnedTensor q = host_tensor(DType::fp8_e4m3, {M, c.hidden_size});
    OwnedTensor s =
        host_tensor(scale_dtype(quant.scheme), act_scale_shape(quant.scheme, M, c.hidden_size));
    quantize_activations(ctx, x, quant.scheme, false, q, s);
    dequantize_activations(ctx, q, s, quant.scheme, x);
  }
  OwnedTensor logits = host_tensor(DType::fp32, {M, c.num_experts});
  fill_random(logits, seed + 1, 1.0f);
  OwnedTensor topk_w = host_tensor(DType::fp32, {M, c.topk});
  OwnedTensor topk_ids = host_tensor(DType::int32, {M, c.topk});
  if (model.routing == bench::Routing::deepseek) {
    OwnedTensor bias = host_tensor(DType::fp32, {c.num_experts});
    fill_random(bias, seed + 2, 0.1f);
    grouped_topk(ctx, logits, bias, c.topk, bench::deepseek_routing(), topk_w, topk_ids);
  } else {
    softmax_topk(ctx, logits, c.topk, /*renormalize=*/true, topk_w, topk_ids);
  }

  Weights w;
  w.w13 = random_weight(c.num_experts, c.w13_rows(), c.hidden_size, c, seed + 100, &w.w13_scale);
  w.w2 = random_weight(c.num_experts, c.hidden_size, c.intermediate_size, c, seed + 100000,
                       &w.w2_scale);
  OwnedTensor out = host_tensor(dtype, {M, c.hidden_size});

  const ModularKernel kernel = make_modular_kernel("NoEPPrepareAndFinalize", "auto", c,
                                                   gpu ? Device::cuda(0) : Device::cpu());
  std::printf("parts: %s + %s\n", kernel.prepare_finalize().name().c_str(),
              kernel.experts().name().c_str());
  ForwardArgs args;
  args.hidden_states = x;
  args.topk_weights = topk_w;
  args.topk_ids = topk_ids;
  args.output = out;
  args.weights = {w.w13, w.w2, w.w13_scale, w.w2_scale, Tensor(), Tensor()};

  double t = 0;
  std::string how;
  if (gpu) {
#if MODMOE_WITH_CUDA
    const bench::GpuForwardTiming g = bench::time_forward_on_gpu(kernel, args, repeats);
    t = g.median_us * 1e-6;
    how = "median of " + std::to_string(g.replays) + " CUDA-graph replays (" +
          std::to_string(g.graph_nodes) + " nodes), L2 flushed";
#endif
  } else {
    std::vector<double> times;
    for (int r = 0; r < repeats + 1; ++r) {  // the first run warms caches and page-faults buffers
      const auto t0 = std::chrono::steady_clock::now();
      kernel.forward(ctx, args);
      const auto t1 = std::chrono::steady_clock::now();
      if (r > 0) times.push_back(std::chrono::duration<double>(t1 - t0).count());
    }
    std::sort(times.begin(), times.end());
    t = times[times.size() / 2];
    how = "median of " + std::to_string(repeats);
  }

  // Work: every (token, k) pair does GEMM1 (w13_rows x K) and GEMM2 (K x N); weight bytes are
  // those of the experts that received at least one token.
  std::vector<char> hit(c.num_experts, 0);
  for (int64_t i = 0; i < M * c.topk; ++i) hit[topk_ids.data_ptr<int32_t>()[i]] = 1;
  const int64_t experts_hit = std::count(hit.begin(), hit.end(), 1);
  const double flops =
      2.0 * M * c.topk * (c.w13_rows() * c.hidden_size + c.hidden_size * c.intermediate_size);
  const double weight_bytes = double(experts_hit) *
                              (c.w13_rows() * c.hidden_size + c.hidden_size * c.intermediate_size) *
                              dtype_size(w.w13.tensor().dtype());
  std::printf("time: %.3f ms (%s)  %.1f GFLOP/s  %.2f GB/s of weights (%lld experts hit)\n",
              t * 1e3, how.c_str(), flops / t * 1e-9, weight_bytes / t * 1e-9,
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
  const double oracle_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const oracle::ErrorReport err = oracle::compare(out, ref, topk_ids, Tensor());
  const double tol = quant.quantized() ? 3e-2 : (dtype == DType::fp32 ? 1e-4 : 1e-2);
  const bool ok = err.passed(tol);
  std::printf("error vs float64 oracle: %s  (tolerance %.0e, oracle %.1f s): %s\n",
              err.str().c_str(), tol, oracle_s, ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream s(text);
  for (std::string item; std::getline(s, item, ',');)
    if (!item.empty()) items.push_back(item);
  return items;
}

// The integer value of `flag`; anything else (trailing characters included) exits 2 naming the
// flag and what was given.
int64_t parse_int(const char* flag, const std::string& text) {
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size()) {
    std::fprintf(stderr, "modmoe-bench: %s: expected an integer, got '%s'\n", flag, text.c_str());
    std::exit(2);
  }
  return v;
}

std::vector<int64_t> parse_int_list(const char* flag, const std::string& text) {
  std::vector<int64_t> values;
  for (const std::string& item : split_list(text)) values.push_back(parse_int(flag, item));
  return values;
}

const ModelShape& model_or_exit(const std::string& name) {
  if (const ModelShape* m = bench::find_model(name)) return *m;
  std::fprintf(stderr, "modmoe-bench: unknown model '%s' (--list-models)\n", name.c_str());
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string model = "qwen3-30b-a3b", shapes, json_path, models_list, ms_list, quants_list;
    std::string rows_list, decode_ms_list, gemm_dtypes_list;  // --gemm subsets
    std::string experts = "auto", pf = "NoEPPrepareAndFinalize";
    int64_t M = 64;
    DType dtype = DType::bf16;
    QuantConfig quant;
    int repeats = -1;                 // per backend default
    int64_t settle_ms = -1;           // GPU suites: bench::kDefaultSettleMs
    std::string flush_kind = "read";  // GPU suites: how the L2 is flushed (bench_device.h)
    uint64_t seed = 1;
    bool check = true, any = false, force_cpu = false, force_gpu = false;
    bool stages = false, baseline = true, flush = true, gemm = false, quick = false;
    bool arena = false;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto next = [&]() -> std::string {
        if (i + 1 >= argc) {
          std::fprintf(stderr, "modmoe-bench: %s needs a value\n", a.c_str());
          usage(2);
        }
        return argv[++i];
      };
      if (a == "--demo")
        any = true;
      else if (a == "--model")
        model = next(), any = true;
      else if (a == "--shapes")
        shapes = next(), any = true;
      else if (a == "--quick")
        shapes = "quick", quick = true, any = true;
      else if (a == "--gemm")
        gemm = true, any = true;
      else if (a == "-m")
        M = parse_int("-m", next());
      else if (a == "--dtype")
        dtype = parse_dtype(next());
      else if (a == "--quant")
        quant.scheme = parse_quant_scheme(next());
      else if (a == "--repeats" || a == "--replays")
        repeats = static_cast<int>(std::max<int64_t>(1, parse_int(a.c_str(), next())));
      else if (a == "--seed")
        seed = static_cast<uint64_t>(parse_int("--seed", next()));
      else if (a == "--no-check")
        check = false;
      else if (a == "--cpu")
        force_cpu = true;
      else if (a == "--gpu")
        force_gpu = true;
      else if (a == "--json")
        json_path = next();
      else if (a == "--stages")
        stages = true;
      else if (a == "--models")
        models_list = next();
      else if (a == "--ms")
        ms_list = next();
      else if (a == "--quants")
        quants_list = next();
      else if (a == "--rows")
        rows_list = next();
      else if (a == "--decode-ms")
        decode_ms_list = next();
      else if (a == "--gemm-dtypes")
        gemm_dtypes_list = next();
      else if (a == "--experts")
        experts = next();
      else if (a == "--pf")
        pf = next();
      else if (a == "--no-baseline")
        baseline = false;
      else if (a == "--arena")
        arena = true;
      else if (a == "--no-flush")
        flush = false;
      else if (a == "--flush") {
        flush_kind = next();
        if (flush_kind != "read" && flush_kind != "write") {
          std::fprintf(stderr, "modmoe-bench: --flush: expected read or write, got '%s'\n",
                       flush_kind.c_str());
          return 2;
        }
      } else if (a == "--settle-ms") {
        settle_ms = parse_int("--settle-ms", next());
        if (settle_ms < 0 || settle_ms > 60000) {
          std::fprintf(stderr, "modmoe-bench: --settle-ms: expected 0 to 60000, got %lld\n",
                       static_cast<long long>(settle_ms));
          return 2;
        }
      } else if (a == "--list-models") {
        for (const auto& m : kModels)
          std::printf("%-16s E=%lld topk=%lld K=%lld N=%lld %s\n", m.name, (long long)m.E,
                      (long long)m.topk, (long long)m.K, (long long)m.N,
                      activation_name(m.activation));
        return 0;
      } else if (a == "-h" || a == "--help")
        usage(0);
      else {
        std::fprintf(stderr, "modmoe-bench: unknown argument '%s'\n", a.c_str());
        usage(2);
      }
    }
    if (!any) usage(2);
    if (force_cpu && force_gpu) {
      std::fprintf(stderr, "modmoe-bench: --cpu and --gpu exclude each other\n");
      return 2;
    }
    const bool have_gpu = cuda_available();
    if (force_gpu && !have_gpu) {
      std::fprintf(stderr,
                   "modmoe-bench: --gpu: no CUDA device is visible, or this build has no "
                   "CUDA backend\n");
      return 2;
    }
    const bool gpu = !force_cpu && have_gpu;

    // Parsed before anything runs, so a bad number fails the same with or without a device.
    const std::vector<int64_t> Ms = parse_int_list("--ms", ms_list);
    [[maybe_unused]] const std::vector<int64_t> rows = parse_int_list("--rows", rows_list);
    [[maybe_unused]] const std::vector<int64_t> decode_ms =
        parse_int_list("--decode-ms", decode_ms_list);
    if (!gemm && (!rows_list.empty() || !decode_ms_list.empty() || !gemm_dtypes_list.empty())) {
      std::fprintf(stderr,
                   "modmoe-bench: --rows, --decode-ms and --gemm-dtypes select --gemm cases; "
                   "add --gemm\n");
      return 2;
    }
    if (gemm) {
      if (force_cpu || (!shapes.empty() && !quick)) {
        std::fprintf(stderr, "modmoe-bench: --gemm runs on a GPU alone; it excludes %s\n",
                     force_cpu ? "--cpu" : "--shapes");
        return 2;
      }
#if MODMOE_WITH_CUDA
      bench::GemmBenchOptions g;
      g.quick = quick;
      g.replays = repeats > 0 ? repeats : 30;
      g.flush_l2 = flush;
      g.flush_kind = flush_kind == "write" ? bench::L2FlushKind::write : bench::L2FlushKind::read;
      if (settle_ms >= 0) bench::set_settle_ms(static_cast<int>(settle_ms));
      g.seed = seed;
      g.json_path = json_path;
      if (!models_list.empty()) g.shapes = split_list(models_list);
      if (!gemm_dtypes_list.empty()) g.dtypes = split_list(gemm_dtypes_list);
      g.rows_per_expert = rows;
      g.decode_ms = decode_ms;
      return bench::run_gemm_bench(g);
#else
      std::printf("modmoe-bench --gemm: skipped: this build has no CUDA backend\n");
      return 0;
#endif
    }

    if (!shapes.empty()) {
      if (!gpu) {
        std::fprintf(stderr, "modmoe-bench: --shapes runs on a GPU only (%s)\n",
                     force_cpu ? "--cpu given" : "no CUDA device visible");
        return 2;
      }
#if MODMOE_WITH_CUDA
      bench::GpuSuiteOptions o;
      std::vector<std::string> names;
      if (shapes == "standard") {
        for (const auto& m : kModels) names.push_back(m.name);
        o.Ms = {1, 16, 128, 1024, 8192};
      } else if (shapes == "quick") {
        names = {"qwen3-30b-a3b", "deepseek-v3"};
        o.Ms = {1, 128, 8192};
      } else {
        std::fprintf(stderr, "modmoe-bench: --shapes expects standard or quick, got '%s'\n",
                     shapes.c_str());
        return 2;
      }
      if (!models_list.empty()) names = split_list(models_list);
      for (const std::string& n : names) o.models.push_back(&model_or_exit(n));
      if (!ms_list.empty()) {
        o.Ms = Ms;
      }
      o.schemes = {QuantScheme::none, QuantScheme::fp8_block};
      if (!quants_list.empty()) {
        o.schemes.clear();
        for (const std::string& q : split_list(quants_list)) {
          const QuantScheme s = parse_quant_scheme(q);
          if (s != QuantScheme::none && s != QuantScheme::fp8_block) {
            std::fprintf(stderr,
                         "modmoe-bench: --quants: the suite runs none and fp8-block, got "
                         "'%s'\n",
                         q.c_str());
            return 2;
          }
          o.schemes.push_back(s);
        }
      }
      o.prepare_finalize = pf;
      o.experts = experts;
      o.replays = repeats > 0 ? repeats : 30;
      o.flush_l2 = flush;
      o.flush_kind = flush_kind == "write" ? bench::L2FlushKind::write : bench::L2FlushKind::read;
      if (settle_ms >= 0) bench::set_settle_ms(static_cast<int>(settle_ms));
      o.baseline = baseline;
      o.stages = stages;
      o.arena = arena;
      o.seed = seed;
      o.json_path = json_path;
      return bench::run_gpu_suite(o);
#endif
    }
    const int r = repeats > 0 ? repeats : (gpu ? 30 : 5);
    return run(model_or_exit(model), M, dtype, quant, r, seed, check, gpu);
  } catch (const modmoe::Error& e) {
    std::fprintf(stderr, "modmoe-bench: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "modmoe-bench: error: %s\n", e.what());
    return 2;
  }
}
