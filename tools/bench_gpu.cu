// modmoe-bench on the GPU: the standard shapes against their floor and the cuBLAS baseline.
//
// Per run: the device's read bandwidth (a streaming-read kernel over 4 GiB) and GEMM peaks
// (8192^3 cuBLAS/cuBLASLt GEMMs in bf16 and e4m3) are measured first, in the same process, so
// the floors use this card at this moment. Per case (model x M x scheme):
//   - weights: random, generated on the device (once per model and scheme, shared by its Ms);
//     x random; routing drawn on the host from random logits with the model's router;
//   - modmoe: one forward eagerly, then one forward captured in a CUDA graph (global capture
//     mode) and timed over `replays` replays with CUDA events, the L2 flushed before each;
//   - the floor: max(bytes / BW, flops / peak) with bytes = weights (+ scales) of the experts that
//     received tokens + x in + out + routing, flops = 2 * M * topk * (2N*K + K*N);
//   - the cuBLAS baseline (bench_cublas.h), captured and timed the same way, and its output
//     compared with modmoe's (relative L2 difference);
//   - memory-bound cases of at most kMaxStreamReadBytes: the floor's bytes read by one streaming
//     kernel, captured and timed the same way ("read_us"): what a single kernel that does nothing
//     but read those bytes takes in a graph, launch and ramp included. The floor has no launch
//     term; this says how much of a small case's ratio is the launch, not the layer's kernels.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <memory>
#include <sstream>

#include "bench_cublas.h"
#include "bench_device.h"
#include "bench_gpu.h"
#include "bench_json.h"
#include "bench_kernels.h"
#include "bench_stages.h"
#include "cuda/cuda_experts.h"
#include "cuda/sm90/sm90_experts.h"
#include "modmoe/cuda.h"
#include "modmoe/modmoe.h"

namespace modmoe::bench {

namespace {

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t hash_name(const char* s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; ++s) h = (h ^ static_cast<unsigned char>(*s)) * 1099511628211ull;
  return h;
}

// Approximately N(0, 1) from a hash of (seed, i), as the device fill does.
float host_normal(uint64_t seed, int64_t i) {
  const uint64_t h = mix(seed * 0x100000001b3ull + static_cast<uint64_t>(i));
  const float u1 = static_cast<float>(h >> 40) / 16777216.0f;
  const float u2 = static_cast<float>((h >> 16) & 0xffffff) / 16777216.0f;
  return (u1 + u2 - 1.0f) * 2.449f;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

// The device (bench_device.h) and the cuBLAS version the suite's baseline runs with
// (major * 10000 + minor * 100 + patch).
struct SuiteDeviceInfo : DeviceInfo {
  int cublas = 0;
};

SuiteDeviceInfo suite_device_info() {
  SuiteDeviceInfo d;
  static_cast<DeviceInfo&>(d) = device_info();
  cublasGetProperty(MAJOR_VERSION, &d.cublas);
  int minor = 0, patch = 0;
  cublasGetProperty(MINOR_VERSION, &minor);
  cublasGetProperty(PATCH_LEVEL, &patch);
  d.cublas = d.cublas * 10000 + minor * 100 + patch;
  return d;
}

// Random expert weights in modmoe's layouts, on the device.
struct DeviceWeights {
  DeviceBuffer w13, w2, w13_scale, w2_scale;
  ExpertWeights view;
  double bytes_per_expert = 0;  // weights + scales of one expert
};

DeviceWeights make_weights(const MoEConfig& c, uint64_t seed, cudaStream_t stream) {
  DeviceWeights w;
  const int64_t E = c.num_local_experts, R = c.w13_rows(), K = c.hidden_size,
                N = c.intermediate_size;
  const Device dev = Device::cuda(0);
  const QuantScheme q = c.quant.scheme;
  if (!c.quant.quantized()) {
    w.w13 = DeviceBuffer(size_t(E * R * K) * dtype_size(c.in_dtype));
    w.w2 = DeviceBuffer(size_t(E * K * N) * dtype_size(c.in_dtype));
    fill_normal(w.w13.get(), c.in_dtype, E * R * K, seed, 1.0f / std::sqrt(float(K)), stream);
    fill_normal(w.w2.get(), c.in_dtype, E * K * N, seed + 1, 1.0f / std::sqrt(float(N)), stream);
    w.view.w13 = Tensor(w.w13.get(), c.in_dtype, {E, R, K}, dev);
    w.view.w2 = Tensor(w.w2.get(), c.in_dtype, {E, K, N}, dev);
    w.bytes_per_expert = double(R * K + K * N) * dtype_size(c.in_dtype);
  } else {
    MODMOE_CHECK(q == QuantScheme::fp8_block)
        << "modmoe-bench: the GPU suite generates bf16 or fp8-block weights, got " << c.quant.str();
    w.w13 = DeviceBuffer(size_t(E * R * K));
    w.w2 = DeviceBuffer(size_t(E * K * N));
    fill_e4m3(w.w13.as<uint8_t>(), E * R * K, seed, stream);
    fill_e4m3(w.w2.as<uint8_t>(), E * K * N, seed + 1, stream);
    const Shape s13 = weight_scale_shape(q, E, R, K), s2 = weight_scale_shape(q, E, K, N);
    w.w13_scale = DeviceBuffer(size_t(shape_numel(s13)) * 4);
    w.w2_scale = DeviceBuffer(size_t(shape_numel(s2)) * 4);
    // Codes are z * 112 (fill_e4m3); scales u / (112 sqrt(fan_in)), u in [0.5, 1.5): the
    // dequantized weights are z * u / sqrt(fan_in), like the bf16 ones.
    const float s_k = 1.0f / (112.0f * std::sqrt(float(K))),
                s_n = 1.0f / (112.0f * std::sqrt(float(N)));
    fill_uniform(w.w13_scale.as<float>(), shape_numel(s13), seed + 2, 0.5f * s_k, 1.5f * s_k,
                 stream);
    fill_uniform(w.w2_scale.as<float>(), shape_numel(s2), seed + 3, 0.5f * s_n, 1.5f * s_n, stream);
    w.view.w13 = Tensor(w.w13.get(), DType::fp8_e4m3, {E, R, K}, dev);
    w.view.w2 = Tensor(w.w2.get(), DType::fp8_e4m3, {E, K, N}, dev);
    w.view.w13_scale = Tensor(w.w13_scale.get(), DType::fp32, s13, dev);
    w.view.w2_scale = Tensor(w.w2_scale.get(), DType::fp32, s2, dev);
    w.bytes_per_expert =
        double(R * K + K * N) + 4.0 * double(shape_numel(s13) + shape_numel(s2)) / E;
  }
  BENCH_CUDA(cudaStreamSynchronize(stream));
  return w;
}

// Routing drawn from random logits with the model's router, on the host (the baseline needs
// the ids there anyway). Logits stay around for --stages' route stage.
struct HostRouting {
  std::vector<float> logits, bias;  // (M, E); (E) for DeepSeek
  OwnedTensor weights, ids;         // (M, topk) fp32 / int32
};

HostRouting draw_routing(const ModelShape& m, int64_t M, uint64_t seed) {
  HostRouting r;
  r.logits.resize(size_t(M * m.E));
  for (int64_t i = 0; i < M * m.E; ++i) r.logits[i] = host_normal(seed, i);
  r.weights = host_tensor(DType::fp32, {M, m.topk});
  r.ids = host_tensor(DType::int32, {M, m.topk});
  const Tensor logits(r.logits.data(), DType::fp32, {M, m.E});
  if (m.routing == Routing::deepseek) {
    r.bias.resize(size_t(m.E));
    for (int64_t e = 0; e < m.E; ++e) r.bias[e] = 0.1f * host_normal(seed + 1, e);
    const Tensor bias(r.bias.data(), DType::fp32, {m.E});
    grouped_topk(Context::cpu(), logits, bias, m.topk, deepseek_routing(), r.weights, r.ids);
  } else {
    softmax_topk(Context::cpu(), logits, m.topk, /*renormalize=*/true, r.weights, r.ids);
  }
  return r;
}

// Which path an apply of M tokens takes inside the experts (the JSON's "path": a route change
// shows in the results, not only in the time): "decode", "grouped" or "hopper" for CudaExperts
// and Sm90Experts, the experts' name for any other part.
std::string experts_path(const Experts& e, int64_t M) {
  if (const auto* sm90 = dynamic_cast<const cuda::Sm90Experts*>(&e)) return sm90->route(M);
  if (const auto* portable = dynamic_cast<const cuda::CudaExperts*>(&e)) return portable->route(M);
  return e.name();
}

struct CaseResult {
  const ModelShape* model = nullptr;
  QuantScheme scheme = QuantScheme::none;
  int64_t M = 0;
  std::string experts_name, pf_name;
  std::string path;  // which path inside the experts ran (experts_path)
  int64_t experts_hit = 0;
  double flops = 0, weight_bytes = 0, bytes = 0;
  Timing modmoe;
  size_t graph_nodes = 0;
  size_t arena_bytes = 0;  // --arena: the forward's workspace bytes (the arena's size)
  int64_t non_finite = -1;
  double floor_us = NAN, peak_tflops = NAN;
  const char* bound = "";
  bool baseline_ran = false;
  std::string baseline_kind, baseline_note;
  Timing baseline;
  size_t baseline_nodes = 0;
  Timing stream_read;  // replays == 0: not measured (compute-bound, or too many bytes)
  double baseline_rel_diff = NAN;
  bool baseline_matches = true;
  std::vector<StageTiming> stages;
  std::string error;

  double ratio() const { return modmoe.median_us / floor_us; }
  double speedup() const { return baseline.median_us / modmoe.median_us; }
  // ISSUE targets: within 1.5x of the floor for M <= 128, 2.5x above; faster than cuBLAS for
  // M <= 1024.
  bool floor_target_met() const { return ratio() <= (M <= 128 ? 1.5 : 2.5); }
  bool baseline_target_met() const { return !baseline_ran || M > 1024 || speedup() > 1.0; }
};

// sum((a-b)^2), sum(b^2), non-finite count of a, on the device.
std::array<double, 3> compare_outputs(const void* a, const void* b, int64_t n,
                                      cudaStream_t stream) {
  DeviceBuffer stats(3 * sizeof(double)), partials(size_t(compare_partials()) * sizeof(double));
  compare_bf16(a, b, n, stats.as<double>(), partials.as<double>(), stream);
  std::array<double, 3> host{};
  BENCH_CUDA(
      cudaMemcpyAsync(host.data(), stats.get(), sizeof(host), cudaMemcpyDeviceToHost, stream));
  BENCH_CUDA(cudaStreamSynchronize(stream));
  return host;
}

// Wraps an allocator and records the most bytes live at once, each allocation rounded as
// ArenaAllocator rounds it: the arena a forward needs when it frees in reverse order (the modular
// kernel's scoped workspaces do; an arena too small for another order says so and the case fails).
class PeakRecorder final : public Allocator {
 public:
  explicit PeakRecorder(Allocator* inner) : inner_(inner) {}
  void* allocate(size_t bytes, void* stream) override {
    void* p = inner_->allocate(bytes, stream);
    if (p != nullptr) peak_ = std::max(peak_, live_ += ArenaAllocator::footprint(bytes));
    return p;
  }
  void deallocate(void* ptr, size_t bytes, void* stream) override {
    if (ptr != nullptr) live_ -= ArenaAllocator::footprint(bytes);
    inner_->deallocate(ptr, bytes, stream);
  }
  Device device() const override { return inner_->device(); }
  size_t peak() const { return peak_; }

 private:
  Allocator* inner_;
  size_t live_ = 0, peak_ = 0;
};

struct SuiteContext {
  const GpuSuiteOptions& options;
  cudaStream_t stream;
  Cublas& cublas;
  L2Flush* flush;
  double read_bw;  // bytes/s
  GemmPeaks peaks;
};

double peak_for(const SuiteContext& s, QuantScheme scheme) {
  if (scheme == QuantScheme::none) return s.peaks.bf16_tflops;
  const double fp8 = std::max(s.peaks.fp8_tensor_tflops, s.peaks.fp8_block_tflops);
  return fp8 > 0 ? fp8 : 2 * s.peaks.bf16_tflops;  // no fp8 measurement: the nominal 2x
}

// Memory-bound cases up to this many bytes (every M = 1 case of the standard shapes) get the
// streaming-read reference; beyond it the buffer would be large and the launch negligible.
constexpr double kMaxStreamReadBytes = double(size_t(1) << 30);

// One streaming-read kernel over `bytes` (rounded down to 16), captured in a graph and timed
// like a case (same flush, settle and replays).
Timing time_stream_read(const SuiteContext& s, size_t bytes) {
  const size_t n = bytes / 16 * 16;
  DeviceBuffer data(n), sink(size_t(stream_read_sink_words()) * 4);
  BENCH_CUDA(cudaMemsetAsync(data.get(), 0x5a, n, s.stream));
  const Graph graph(s.stream, cudaStreamCaptureModeThreadLocal,
                    [&] { stream_read(data.get(), n, sink.as<uint32_t>(), s.stream); });
  return time_replays(s.stream, s.options.replays, 2, s.flush, [&] { graph.launch(s.stream); });
}

void run_case(const SuiteContext& s, const ModelShape& model, QuantScheme scheme, int64_t M,
              const DeviceWeights& weights, CaseResult& r) {
  const GpuSuiteOptions& o = s.options;
  const cudaStream_t stream = s.stream;
  QuantConfig quant;
  quant.scheme = scheme;
  MoEConfig c = model_config(model, DType::bf16, quant);
  c.max_num_tokens = M;  // a batched --pf (one rank sends all M tokens); standard parts ignore it
  const int64_t K = c.hidden_size, N = c.intermediate_size, topk = c.topk;
  const uint64_t seed = mix(o.seed ^ hash_name(model.name)) + uint64_t(M);

  // Inputs.
  HostRouting routing = draw_routing(model, M, seed);
  std::vector<char> hit(size_t(model.E), 0);
  const int32_t* ids = routing.ids.data_ptr<int32_t>();
  for (int64_t i = 0; i < M * topk; ++i) hit[size_t(ids[i])] = 1;
  r.experts_hit = std::count(hit.begin(), hit.end(), 1);
  DeviceBuffer x(size_t(M * K) * 2), out(size_t(M * K) * 2);
  fill_normal(x.get(), DType::bf16, M * K, seed + 7, 1.0f, stream);
  const std::vector<float> host_w(routing.weights.data_ptr<float>(),
                                  routing.weights.data_ptr<float>() + M * topk);
  const std::vector<int32_t> host_ids(ids, ids + M * topk);
  const DeviceBuffer topk_weights = upload(host_w), topk_ids = upload(host_ids);

  // Work and the floor.
  r.flops = 2.0 * M * topk * double(c.w13_rows() * K + K * N);
  r.weight_bytes = r.experts_hit * weights.bytes_per_expert;
  r.bytes = r.weight_bytes + 2.0 * M * K * 2 + double(M * topk) * 8;
  r.peak_tflops = peak_for(s, scheme);
  const double t_mem = r.bytes / s.read_bw, t_math = r.flops / (r.peak_tflops * 1e12);
  r.floor_us = std::max(t_mem, t_math) * 1e6;
  r.bound = t_mem >= t_math ? "memory" : "compute";

  // modmoe: eager once, then a captured forward.
  const ModularKernel kernel =
      make_modular_kernel(o.prepare_finalize, o.experts, c, Device::cuda(0));
  r.experts_name = kernel.experts().name();
  r.path = experts_path(kernel.experts(), M);
  r.pf_name = kernel.prepare_finalize().name();
  Context ctx = cuda_context(0, stream);
  const Device dev = Device::cuda(0);
  ForwardArgs args;
  args.hidden_states = Tensor(x.get(), DType::bf16, {M, K}, dev);
  args.topk_weights = Tensor(topk_weights.get(), DType::fp32, {M, topk}, dev);
  args.topk_ids = Tensor(topk_ids.get(), DType::int32, {M, topk}, dev);
  args.output = Tensor(out.get(), DType::bf16, {M, K}, dev);
  args.weights = weights.view;
  DeviceBuffer arena_memory;
  std::unique_ptr<ArenaAllocator> arena;
  if (o.arena) {
    PeakRecorder recorder(ctx.alloc());
    Context sizing = ctx;
    sizing.allocator = &recorder;
    kernel.forward(sizing, args);
    BENCH_CUDA(cudaStreamSynchronize(stream));
    arena_memory = DeviceBuffer(std::max(recorder.peak(), ArenaAllocator::kAlignment));
    arena = std::make_unique<ArenaAllocator>(arena_memory.get(), arena_memory.bytes(), dev);
    ctx.allocator = arena.get();
    r.arena_bytes = arena_memory.bytes();
  }
  kernel.forward(ctx, args);
  BENCH_CUDA(cudaStreamSynchronize(stream));
  {
    const Graph graph(stream, cudaStreamCaptureModeGlobal, [&] { kernel.forward(ctx, args); });
    r.graph_nodes = graph.nodes();
    r.modmoe = time_replays(stream, o.replays, 2, s.flush, [&] { graph.launch(stream); });
  }
  r.non_finite = static_cast<int64_t>(compare_outputs(out.get(), out.get(), M * K, stream)[2]);
  if (std::string(r.bound) == "memory" && r.bytes <= kMaxStreamReadBytes)
    r.stream_read = time_stream_read(s, size_t(r.bytes));

  // The cuBLAS baseline on the same inputs.
  if (o.baseline) {
    try {
      BaselineInputs in;
      in.config = c;
      in.M = M;
      in.x = x.get();
      in.topk_weights = topk_weights.as<float>();
      in.topk_ids = host_ids;
      in.weights = weights.view;
      CublasBaseline baseline(s.cublas, in);
      r.baseline_kind = baseline.kind();
      baseline.enqueue();
      BENCH_CUDA(cudaStreamSynchronize(stream));
      const Graph graph(stream, cudaStreamCaptureModeThreadLocal, [&] { baseline.enqueue(); });
      r.baseline_nodes = graph.nodes();
      r.baseline = time_replays(stream, o.replays, 2, s.flush, [&] { graph.launch(stream); });
      r.baseline_ran = true;
      const auto diff = compare_outputs(out.get(), baseline.output(), M * K, stream);
      r.baseline_rel_diff = std::sqrt(diff[0] / std::max(diff[1], 1e-300));
      // Both round x, the intermediate and the output the same way up to accumulation order
      // (bf16) or quantize the same groups (fp8): they must agree closely.
      r.baseline_matches = r.baseline_rel_diff <= (scheme == QuantScheme::none ? 2e-2 : 5e-2);
    } catch (const std::exception& e) {
      r.baseline_note = e.what();
      const cudaError_t sticky = cudaStreamSynchronize(stream);
      MODMOE_CHECK(sticky == cudaSuccess)
          << "the cuBLAS baseline left a CUDA error: " << cudaGetErrorString(sticky) << " after "
          << e.what();
    }
  }

  if (o.stages) {
    DeviceBuffer logits = upload(routing.logits), bias = upload(routing.bias);
    StageInputs in;
    in.config = c;
    in.M = M;
    in.routing = model.routing;
    in.x = x.get();
    in.logits = logits.as<float>();
    in.correction_bias = routing.bias.empty() ? nullptr : bias.as<float>();
    in.weights = weights.view;
    r.stages = time_stages(in, stream, o.replays, s.flush);
  }
}

std::string case_json(const CaseResult& r) {
  JsonObject j;
  j.str("model", r.model->name)
      .str("quant", quant_scheme_name(r.scheme))
      .num("M", r.M)
      .num("E", r.model->E)
      .num("topk", r.model->topk)
      .num("K", r.model->K)
      .num("N", r.model->N)
      .str("activation", activation_name(r.model->activation))
      .str("prepare_finalize", r.pf_name)
      .str("experts", r.experts_name)
      .str("path", r.path)
      .num("experts_hit", r.experts_hit)
      .num("flops", r.flops)
      .num("weight_bytes", r.weight_bytes)
      .num("bytes", r.bytes);
  if (!r.error.empty()) {
    j.str("error", r.error);
    return j.dump(4);
  }
  j.num("time_us", r.modmoe.median_us)
      .num("time_min_us", r.modmoe.min_us)
      .num("time_max_us", r.modmoe.max_us)
      .num("replays", int64_t(r.modmoe.replays))
      .num("graph_nodes", int64_t(r.graph_nodes))
      .num("arena_bytes", int64_t(r.arena_bytes))
      .num("tflops", r.flops / (r.modmoe.median_us * 1e-6) * 1e-12)
      .num("weight_GBps", r.weight_bytes / (r.modmoe.median_us * 1e-6) * 1e-9)
      .num("non_finite_outputs", r.non_finite)
      .num("peak_tflops_used", r.peak_tflops)
      .num("floor_us", r.floor_us)
      .str("floor_bound", r.bound)
      .num("ratio_to_floor", r.ratio())
      .flag("floor_target_met", r.floor_target_met());
  if (r.stream_read.replays > 0) j.num("stream_read_us", r.stream_read.median_us);
  if (r.baseline_ran) {
    j.str("baseline", r.baseline_kind)
        .num("baseline_us", r.baseline.median_us)
        .num("baseline_graph_nodes", int64_t(r.baseline_nodes))
        .num("speedup_vs_baseline", r.speedup())
        .num("baseline_rel_diff", r.baseline_rel_diff)
        .flag("baseline_matches", r.baseline_matches)
        .flag("baseline_target_met", r.baseline_target_met());
  } else {
    j.add("baseline", "null").str("baseline_note", r.baseline_note);
  }
  if (!r.stages.empty()) {
    std::vector<std::string> stages;
    for (const StageTiming& st : r.stages) {
      JsonObject o;
      o.str("name", st.name).str("covers", st.covers);
      if (st.time.replays > 0)
        o.num("time_us", st.time.median_us);
      else
        o.add("time_us", "null");
      if (!st.error.empty()) o.str("error", st.error);
      stages.push_back(o.dump(8));
    }
    j.add("stages", json_array(stages, 6));
  }
  return j.dump(4);
}

void print_stages(const CaseResult& r) {
  double sum = 0;
  std::printf("  stages of %s M=%lld %s (median us, each alone, L2 flushed):\n", r.model->name,
              static_cast<long long>(r.M), quant_scheme_name(r.scheme));
  for (const StageTiming& st : r.stages) {
    if (!st.error.empty()) {
      std::printf("    %-10s error: %s\n", st.name.c_str(), st.error.c_str());
    } else if (st.time.replays == 0) {
      std::printf("    %-10s -\n", st.name.c_str());
    } else {
      std::printf("    %-10s %9.1f   %s\n", st.name.c_str(), st.time.median_us, st.covers.c_str());
      sum += st.time.median_us;
    }
  }
  std::printf("    %-10s %9.1f   (whole forward %.1f)\n", "sum", sum, r.modmoe.median_us);
}

void print_table(const std::vector<CaseResult>& results) {
  std::printf("\n%-16s %-9s %5s %4s %9s %7s %7s %9s %6s %8s %9s %7s %8s %s\n", "model", "quant",
              "M", "hit", "us", "TFLOP/s", "wGB/s", "floor_us", "xfloor", "read_us", "cublas_us",
              "speedup", "rel_diff", "notes");
  for (const CaseResult& r : results) {
    std::printf("%-16s %-9s %5lld %4lld ", r.model->name, quant_scheme_name(r.scheme),
                static_cast<long long>(r.M), static_cast<long long>(r.experts_hit));
    if (!r.error.empty()) {
      std::printf("ERROR: %.100s\n", r.error.c_str());
      continue;
    }
    const double t = r.modmoe.median_us;
    std::printf("%9.1f %7.1f %7.0f %9.1f %6.2f ", t, r.flops / t * 1e-6, r.weight_bytes / t * 1e-3,
                r.floor_us, r.ratio());
    if (r.stream_read.replays > 0) {
      std::printf("%8.1f ", r.stream_read.median_us);
    } else {
      std::printf("%8s ", "-");
    }
    if (r.baseline_ran) {
      std::printf("%9.1f %7.2f %8.1e ", r.baseline.median_us, r.speedup(), r.baseline_rel_diff);
    } else {
      std::printf("%9s %7s %8s ", "-", "-", "-");
    }
    std::string notes;
    if (r.non_finite != 0) notes += "NON-FINITE ";
    if (!r.floor_target_met()) notes += "floor-target ";
    if (!r.baseline_target_met()) notes += "slower-than-cublas ";
    if (r.baseline_ran && !r.baseline_matches) notes += "BASELINE-MISMATCH ";
    if (!r.baseline_ran && !r.baseline_note.empty()) notes += "no-baseline ";
    std::printf("%s\n", notes.c_str());
  }
}

}  // namespace

std::string gpu_name() {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return "unknown GPU";
  return p.name;
}

int run_gpu_suite(const GpuSuiteOptions& o) {
  MODMOE_CHECK(o.replays >= 1) << "modmoe-bench: replays must be >= 1, got " << o.replays;
  BENCH_CUDA(cudaSetDevice(0));
  cudaStream_t stream = nullptr;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const SuiteDeviceInfo info = suite_device_info();
  std::printf(
      "modmoe-bench: %s, %d SMs, sm_%d%d, L2 %.0f MB, %.0f GB; CUDA runtime %d, cuBLAS %d\n",
      info.name.c_str(), info.sm_count, info.cc_major, info.cc_minor, info.l2_bytes / 1e6,
      info.memory_bytes / 1e9, info.runtime, info.cublas);

  // Ceilings, measured now.
  Cublas cublas(stream);
  size_t free_bytes = 0, total_bytes = 0;
  BENCH_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
  const size_t bw_bytes = std::min<size_t>(size_t(4) << 30, free_bytes / 4) / 16 * 16;
  const double read_bw = measure_read_bandwidth(bw_bytes, stream);
  // Not in the floor (its bytes are over the read rate, as the issue defines it): the ceilings
  // of the kernels that mostly write (quantize-scatter) or read and write (gather, reduce).
  const double write_bw = measure_write_bandwidth(bw_bytes, stream);
  const double copy_bw = measure_copy_bandwidth(bw_bytes, stream);
  const GemmPeaks peaks = measure_gemm_peaks(cublas, 8192, 10);
  std::printf(
      "ceilings: read %.0f GB/s (%.1f GiB streamed), write %.0f GB/s, copy %.0f GB/s (read + "
      "written); GEMM 8192^3: bf16 %.0f TFLOP/s, fp8 per-tensor %.0f, fp8 block-scaled %.0f%s%s\n",
      read_bw * 1e-9, bw_bytes / double(1 << 30), write_bw * 1e-9, copy_bw * 1e-9,
      peaks.bf16_tflops, peaks.fp8_tensor_tflops, peaks.fp8_block_tflops,
      peaks.notes.empty() ? "" : "; ", peaks.notes.c_str());
  std::fflush(stdout);

  L2Flush flush_buffer = o.flush_l2 ? L2Flush(info.l2_bytes, o.flush_kind) : L2Flush();
  const LaunchFloor launch = measure_launch_floor(stream, o.flush_l2 ? &flush_buffer : nullptr);
  std::printf(
      "graph launch (empty kernels, timed like a case): 1 kernel %.1f us, 2 kernels %.1f us, 1 "
      "kernel between 2 allocations and their frees %.1f us\n",
      launch.one_kernel_us, launch.two_kernels_us, launch.one_kernel_two_allocations_us);
  std::fflush(stdout);
  SuiteContext s{o, stream, cublas, o.flush_l2 ? &flush_buffer : nullptr, read_bw, peaks};
  std::vector<CaseResult> results;
  bool sticky_error = false;
  for (const ModelShape* model : o.models) {
    for (QuantScheme scheme : o.schemes) {
      if (sticky_error) break;
      QuantConfig quant;
      quant.scheme = scheme;
      std::unique_ptr<DeviceWeights> weights;
      std::string weights_error;
      try {
        weights = std::make_unique<DeviceWeights>(
            make_weights(model_config(*model, DType::bf16, quant),
                         mix(o.seed ^ hash_name(model->name)) + 3 * int(scheme), stream));
      } catch (const std::exception& e) {
        weights_error = std::string("generating weights: ") + e.what();
      }
      for (int64_t M : o.Ms) {
        CaseResult r;
        r.model = model;
        r.scheme = scheme;
        r.M = M;
        if (!weights) {
          r.error = weights_error;
        } else {
          try {
            run_case(s, *model, scheme, M, *weights, r);
          } catch (const std::exception& e) {
            r.error = e.what();
            // An error inside a kernel poisons the context: nothing after it can be trusted.
            const cudaError_t state = cudaDeviceSynchronize();
            if (state != cudaSuccess) {
              r.error += std::string(" [CUDA context lost: ") + cudaGetErrorString(state) + "]";
              sticky_error = true;
            }
          }
        }
        if (r.error.empty()) {
          std::printf(
              "%-16s %-9s M=%-5lld %9.1f us  %6.2fx floor  %s%s\n", model->name,
              quant_scheme_name(scheme), static_cast<long long>(M), r.modmoe.median_us, r.ratio(),
              r.baseline_ran ? "" : "no baseline: ", r.baseline_ran ? "" : r.baseline_note.c_str());
          if (r.baseline_ran) {
            std::printf("%35s cuBLAS %9.1f us  speedup %.2f  rel diff %.1e\n", "",
                        r.baseline.median_us, r.speedup(), r.baseline_rel_diff);
          }
        } else {
          std::printf("%-16s %-9s M=%-5lld ERROR %s\n", model->name, quant_scheme_name(scheme),
                      static_cast<long long>(M), r.error.c_str());
        }
        if (!r.stages.empty()) print_stages(r);
        std::fflush(stdout);
        results.push_back(std::move(r));
        if (sticky_error) break;
      }
      weights.reset();
      trim_device_memory();
    }
  }

  int errors = 0, non_finite = 0, mismatches = 0, floor_misses = 0, slower = 0;
  for (const CaseResult& r : results) {
    if (!r.error.empty()) {
      ++errors;
      continue;
    }
    non_finite += r.non_finite != 0;
    mismatches += r.baseline_ran && !r.baseline_matches && r.scheme == QuantScheme::none;
    floor_misses += !r.floor_target_met();
    slower += !r.baseline_target_met();
  }

  if (!o.json_path.empty()) {
    JsonObject device;
    device.str("name", info.name)
        .num("sm_count", int64_t(info.sm_count))
        .str("compute_capability",
             std::to_string(info.cc_major) + "." + std::to_string(info.cc_minor))
        .num("l2_bytes", int64_t(info.l2_bytes))
        .num("memory_bytes", int64_t(info.memory_bytes))
        .num("cuda_runtime", int64_t(info.runtime))
        .num("cuda_driver", int64_t(info.driver))
        .num("cublas", int64_t(info.cublas));
    JsonObject settings;
    settings.num("replays", int64_t(o.replays))
        .flag("flush_l2", o.flush_l2)
        .str("flush_kind", l2_flush_kind_name(o.flush_kind))
        .num("settle_ms", int64_t(settle_ms()))
        .num("seed", int64_t(o.seed))
        .str("prepare_finalize", o.prepare_finalize)
        .str("experts", o.experts)
        .flag("stages", o.stages)
        .flag("arena", o.arena);
    JsonObject peak;
    peak.num("gemm_size", peaks.size)
        .num("bf16_tflops", peaks.bf16_tflops)
        .num("fp8_tensor_tflops", peaks.fp8_tensor_tflops)
        .num("fp8_block_tflops", peaks.fp8_block_tflops)
        .num("fp8_tflops_used", peak_for(s, QuantScheme::fp8_block))
        .str("notes", peaks.notes);
    std::vector<std::string> cases;
    for (const CaseResult& r : results) cases.push_back(case_json(r));
    JsonObject root;
    root.str("tool", "modmoe-bench")
        .str("date", utc_now())
        .add("device", device.dump(2))
        .add("settings", settings.dump(2))
        .num("read_bw_GBps", read_bw * 1e-9)
        .num("read_bw_bytes", int64_t(bw_bytes))
        .num("write_bw_GBps", write_bw * 1e-9)
        .num("copy_bw_GBps", copy_bw * 1e-9)
        .add("peaks", peak.dump(2))
        .add("launch_floor_us",
             JsonObject()
                 .num("one_kernel", launch.one_kernel_us)
                 .num("two_kernels", launch.two_kernels_us)
                 .num("one_kernel_two_allocations", launch.one_kernel_two_allocations_us)
                 .dump(2))
        .add("summary", JsonObject()
                            .num("cases", int64_t(results.size()))
                            .num("errors", int64_t(errors))
                            .num("non_finite", int64_t(non_finite))
                            .num("bf16_baseline_mismatches", int64_t(mismatches))
                            .num("floor_target_misses", int64_t(floor_misses))
                            .num("slower_than_cublas", int64_t(slower))
                            .dump(2))
        .add("cases", json_array(cases, 2));
    std::ofstream f(o.json_path);
    f << root.dump() << "\n";
    MODMOE_CHECK(f.good()) << "modmoe-bench: could not write " << o.json_path;
    std::printf("wrote %s\n", o.json_path.c_str());
  }

  std::printf(
      "\nceilings: read %.0f GB/s (write %.0f, copy %.0f); bf16 %.0f TFLOP/s; fp8 %.0f TFLOP/s "
      "(per-tensor %.0f, block %.0f); graph launch %.1f us (1 empty kernel), %.1f us (2), %.1f us "
      "(1 between 2 allocations and their frees)\n",
      read_bw * 1e-9, write_bw * 1e-9, copy_bw * 1e-9, peaks.bf16_tflops,
      peak_for(s, QuantScheme::fp8_block), peaks.fp8_tensor_tflops, peaks.fp8_block_tflops,
      launch.one_kernel_us, launch.two_kernels_us, launch.one_kernel_two_allocations_us);
  print_table(results);
  std::printf(
      "\n%zu cases: %d errors, %d with non-finite outputs, %d bf16 baseline mismatches; "
      "targets: %d over their floor ratio, %d slower than cuBLAS (M <= 1024)\n",
      results.size(), errors, non_finite, mismatches, floor_misses, slower);
  cudaStreamDestroy(stream);
  return (errors || non_finite || mismatches) ? 1 : 0;
}

GpuForwardTiming time_forward_on_gpu(const ModularKernel& kernel, const ForwardArgs& host,
                                     int replays) {
  BENCH_CUDA(cudaSetDevice(0));
  cudaStream_t stream = nullptr;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<DeviceBuffer> storage;
  storage.reserve(16);
  auto to_device = [&](const Tensor& t) -> Tensor {
    if (!t.defined()) return Tensor();
    MODMOE_CHECK(t.is_contiguous() && t.device().is_cpu())
        << "time_forward_on_gpu: host tensors must be contiguous and on the cpu, got "
        << t.describe();
    storage.emplace_back(t.nbytes());
    BENCH_CUDA(cudaMemcpy(storage.back().get(), t.data(), t.nbytes(), cudaMemcpyHostToDevice));
    return Tensor(storage.back().get(), t.dtype(), t.shape(), Device::cuda(0));
  };
  ForwardArgs args = host;
  args.hidden_states = to_device(host.hidden_states);
  args.topk_weights = to_device(host.topk_weights);
  args.topk_ids = to_device(host.topk_ids);
  args.output = to_device(host.output);
  args.expert_map = to_device(host.expert_map);
  for (auto [dst, src] : {std::pair{&args.weights.w13, &host.weights.w13},
                          std::pair{&args.weights.w2, &host.weights.w2},
                          std::pair{&args.weights.w13_scale, &host.weights.w13_scale},
                          std::pair{&args.weights.w2_scale, &host.weights.w2_scale},
                          std::pair{&args.weights.a13_scale, &host.weights.a13_scale},
                          std::pair{&args.weights.a2_scale, &host.weights.a2_scale}}) {
    *dst = to_device(*src);
  }
  cudaDeviceProp p{};
  BENCH_CUDA(cudaGetDeviceProperties(&p, 0));
  const Context ctx = cuda_context(0, stream);
  kernel.forward(ctx, args);
  BENCH_CUDA(cudaStreamSynchronize(stream));
  GpuForwardTiming result;
  result.device_name = p.name;
  {
    L2Flush flush(p.l2CacheSize);
    const Graph graph(stream, cudaStreamCaptureModeGlobal, [&] { kernel.forward(ctx, args); });
    result.graph_nodes = graph.nodes();
    BENCH_CUDA(cudaMemsetAsync(args.output.data(), 0xff, args.output.nbytes(), stream));
    const Timing t = time_replays(stream, replays, 1, &flush, [&] { graph.launch(stream); });
    result.median_us = t.median_us;
    result.min_us = t.min_us;
    result.replays = t.replays;
  }
  BENCH_CUDA(cudaMemcpyAsync(host.output.data(), args.output.data(), host.output.nbytes(),
                             cudaMemcpyDeviceToHost, stream));
  BENCH_CUDA(cudaStreamSynchronize(stream));
  storage.clear();
  cudaStreamDestroy(stream);
  trim_device_memory();
  return result;
}

}  // namespace modmoe::bench
