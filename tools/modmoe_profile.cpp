// modmoe-profile: times each stage of one forward of a (PrepareAndFinalize, Experts) pair and
// writes a Chrome trace (chrome://tracing, https://ui.perfetto.dev).
//
//   modmoe-profile --pf-type P --experts-type X [shape flags] [--device cuda] --out trace.json
//
// The stages are the TraceRanges the library opens (modmoe/trace.h): prepare / quantize /
// apply / gemm1 / ... / finalize. On the CPU they are timed with steady_clock; on a GPU with
// CUDA events on the forward's stream, plus NVTX ranges for Nsight Systems (docs/profiling.md).
//
// Exit codes: 0 done; 1 the forward or the trace failed; 2 usage error or incompatible pair.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "bench_json.h"
#include "modmoe/activation.h"
#include "modmoe/context.h"
#include "modmoe/cuda.h"
#include "modmoe/error.h"
#include "modmoe/modular_kernel.h"
#include "modmoe/quant.h"
#include "modmoe/registry.h"
#include "oracle/problem.h"
#include "profile_tracers.h"

#if MODMOE_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace {

using namespace modmoe;

constexpr int kExitOk = 0;
constexpr int kExitFail = 1;
constexpr int kExitUsage = 2;

constexpr const char* kUsage = R"(usage:
  modmoe-profile --pf-type P --experts-type X [options]

Builds the modular kernel of one registered pair, runs --warmup forwards on a random problem,
then one forward with a tracer installed in the Context, and prints each stage's start and
duration (nested stages indented). --out writes the stages as a Chrome trace JSON that opens
in https://ui.perfetto.dev or chrome://tracing. On --device cuda the stages are timed with CUDA
events on the forward's stream and also marked with NVTX ranges (see docs/profiling.md).

options:
  --pf-type P             a registered PrepareAndFinalize (modmoe-check --list)
  --experts-type X        a registered Experts, or 'auto'
  -m M                    tokens (default 64)
  -k K                    hidden size (default 256)
  -n N                    intermediate size per expert (default 128)
  --num-experts E         global experts (default 8)
  --num-local-experts EL  local experts, EL <= E; uses a random expert_map
  --topk T                experts per token (default 2)
  --dtype D               bf16 | fp16 | fp32 (default bf16)
  --quant Q               none | fp8-tensor | fp8-token | fp8-block | mxfp8 (default none)
  --static-scale          static activation scales (fp8-tensor only)
  --activation A          silu | gelu | gelu_tanh | swigluoai | *_no_mul (default silu)
  --layout L              gate_up | up_gate | interleaved (default gate_up)
  --max-tokens T          config.max_num_tokens (batched parts; default M)
  --chunk-size C          Context::chunk_size, tokens per Experts::apply (<= 0: no limit)
  --seed S                seed of the random problem (default 1)
  --device D              cpu | cuda | cuda:N (default cpu)
  --warmup W              untraced forwards before the traced one (default 3)
  --out FILE              write the Chrome trace JSON to FILE

exit status: 0 done, 1 failure, 2 usage error or incompatible pair
)";

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Options {
  bool help = false;
  std::string pf_type, experts_type;
  MoEConfig config;
  int64_t M = 64;
  std::optional<int64_t> num_local_experts, max_tokens, chunk_size;
  uint64_t seed = 1;
  Device device = Device::cpu();
  int64_t warmup = 3;
  std::string out;
};

int64_t parse_int(const std::string& flag, const std::string& text) {
  try {
    size_t used = 0;
    const long long v = std::stoll(text, &used);
    if (used == text.size()) return v;
  } catch (const std::exception&) {
  }
  throw UsageError(flag + " expects an integer, got '" + text + "'");
}

// Library parsers throw modmoe::Error listing the valid choices; report them as usage errors.
template <typename Parse>
auto parse_choice(const std::string& flag, const std::string& text, Parse parse) {
  try {
    return parse(text);
  } catch (const Error& e) {
    throw UsageError(flag + ": " + e.what());
  }
}

DType parse_in_dtype(const std::string& text) {
  for (DType d : {DType::bf16, DType::fp16, DType::fp32})
    if (text == dtype_name(d)) return d;
  throw UsageError("--dtype: unknown dtype '" + text + "', expected one of bf16, fp16, fp32");
}

Device parse_device(const std::string& text) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  if (text.rfind("cuda:", 0) == 0) {
    const int64_t index = parse_int("--device", text.substr(5));
    if (index >= 0) return Device::cuda(static_cast<int>(index));
  }
  throw UsageError("--device: expected cpu, cuda or cuda:N, got '" + text + "'");
}

Options parse_args(int argc, char** argv) {
  Options o;
  MoEConfig& c = o.config;
  c.num_experts = 8;
  c.hidden_size = 256;
  c.intermediate_size = 128;
  c.topk = 2;
  c.in_dtype = DType::bf16;
  std::string flag;
  auto positive = [&](const std::string& text) {
    const int64_t v = parse_int(flag, text);
    if (v < 1) throw UsageError(flag + " must be >= 1, got " + text);
    return v;
  };
  using Setter = std::function<void(const std::string&)>;
  const std::map<std::string, std::pair<bool, Setter>> flags = {
      // {takes a value, setter}
      {"--help", {false, [&](const std::string&) { o.help = true; }}},
      {"-h", {false, [&](const std::string&) { o.help = true; }}},
      {"--pf-type", {true, [&](const std::string& v) { o.pf_type = v; }}},
      {"--experts-type", {true, [&](const std::string& v) { o.experts_type = v; }}},
      {"-m", {true, [&](const std::string& v) { o.M = positive(v); }}},
      {"-k", {true, [&](const std::string& v) { c.hidden_size = positive(v); }}},
      {"-n", {true, [&](const std::string& v) { c.intermediate_size = positive(v); }}},
      {"--num-experts", {true, [&](const std::string& v) { c.num_experts = positive(v); }}},
      {"--num-local-experts",
       {true, [&](const std::string& v) { o.num_local_experts = positive(v); }}},
      {"--topk", {true, [&](const std::string& v) { c.topk = positive(v); }}},
      {"--dtype", {true, [&](const std::string& v) { c.in_dtype = parse_in_dtype(v); }}},
      {"--quant",
       {true,
        [&](const std::string& v) { c.quant.scheme = parse_choice(flag, v, parse_quant_scheme); }}},
      {"--static-scale", {false, [&](const std::string&) { c.quant.static_act_scale = true; }}},
      {"--activation",
       {true,
        [&](const std::string& v) { c.activation = parse_choice(flag, v, parse_activation); }}},
      {"--layout",
       {true,
        [&](const std::string& v) { c.gated_layout = parse_choice(flag, v, parse_gated_layout); }}},
      {"--max-tokens", {true, [&](const std::string& v) { o.max_tokens = positive(v); }}},
      {"--chunk-size", {true, [&](const std::string& v) { o.chunk_size = parse_int(flag, v); }}},
      {"--seed",
       {true,
        [&](const std::string& v) {
          const int64_t seed = parse_int(flag, v);
          if (seed < 0) throw UsageError("--seed must be >= 0, got " + v);
          o.seed = static_cast<uint64_t>(seed);
        }}},
      {"--device", {true, [&](const std::string& v) { o.device = parse_device(v); }}},
      {"--warmup",
       {true,
        [&](const std::string& v) {
          o.warmup = parse_int(flag, v);
          if (o.warmup < 0) throw UsageError("--warmup must be >= 0, got " + v);
        }}},
      {"--out", {true, [&](const std::string& v) { o.out = v; }}},
  };
  std::map<std::string, int> seen;
  for (int i = 1; i < argc; ++i) {
    flag = argv[i];
    std::optional<std::string> value;  // from "--flag=value"
    if (const size_t eq = flag.find('='); flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    }
    const auto it = flags.find(flag);
    if (it == flags.end()) {
      throw UsageError("unknown argument '" + flag + "' (--help lists the options)");
    }
    if (++seen[flag] > 1) throw UsageError(flag + " given more than once");
    const auto& [takes_value, set] = it->second;
    if (!takes_value) {
      if (value) throw UsageError(flag + " takes no value");
      set("");
      continue;
    }
    if (!value) {
      if (i + 1 >= argc) throw UsageError(flag + " expects a value");
      value = argv[++i];
    }
    set(*value);
  }
  c.num_local_experts = o.num_local_experts.value_or(c.num_experts);
  // Standard parts ignore max_num_tokens; batched ones need it, and one rank sends all M tokens.
  c.max_num_tokens = o.max_tokens.value_or(o.M);
  return o;
}

// ---- running ------------------------------------------------------------------------------------

#if MODMOE_WITH_CUDA
class CudaStream {
 public:
  CudaStream() {
    const cudaError_t e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
    MODMOE_CHECK(e == cudaSuccess)
        << "modmoe-profile: cudaStreamCreateWithFlags failed: " << cudaGetErrorString(e);
  }
  ~CudaStream() { cudaStreamDestroy(stream_); }
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};
#endif

void synchronize_if_cuda(const Context& ctx) {
  if (ctx.device.is_cuda()) synchronize(ctx);
}

// Runs `warmup` untraced forwards, then one inside a "forward" range on `tracer`, and returns
// the recorded stages (the GPU stream is synchronized first).
std::vector<profile::StageTiming> profile_forward(const ModularKernel& kernel,
                                                  const testing::Problem& p, const Options& o,
                                                  profile::ProfileTracer& tracer) {
  ForwardArgs args;
  args.hidden_states = p.hidden_states;
  args.topk_weights = p.topk_weights;
  args.topk_ids = p.topk_ids;
  args.output = p.output;
  args.weights = p.weights();
  args.expert_map = p.expert_map;
  auto run = [&](Context& ctx) {
    if (o.chunk_size) ctx.chunk_size = *o.chunk_size;
    for (int64_t i = 0; i < o.warmup; ++i) kernel.forward(ctx, args);
    synchronize_if_cuda(ctx);
    tracer.clear();
    ctx.tracer = &tracer;
    {
      TraceRange range(ctx, "forward");
      kernel.forward(ctx, args);
    }
    ctx.tracer = nullptr;
    synchronize_if_cuda(ctx);
    return tracer.timings();
  };
  if (o.device.is_cpu()) {
    Context ctx = Context::cpu();
    return run(ctx);
  }
#if MODMOE_WITH_CUDA
  const CudaStream stream;
  Context ctx = cuda_context(o.device.index, stream.get());
  Allocator* alloc = cuda_default_allocator(o.device.index);
  std::vector<OwnedTensor> storage;  // destroyed (freed on the stream) before the stream
  storage.reserve(16);
  auto to_device = [&](const Tensor& host) -> Tensor {
    if (!host.defined()) return Tensor();
    storage.emplace_back(alloc, host.dtype(), host.shape(), ctx.stream);
    copy_tensor(ctx, storage.back(), host);
    return storage.back().tensor();
  };
  args.hidden_states = to_device(args.hidden_states);
  args.topk_weights = to_device(args.topk_weights);
  args.topk_ids = to_device(args.topk_ids);
  args.output = to_device(args.output);
  args.expert_map = to_device(args.expert_map);
  ExpertWeights& w = args.weights;
  for (Tensor* t : {&w.w13, &w.w2, &w.w13_scale, &w.w2_scale, &w.a13_scale, &w.a2_scale})
    *t = to_device(*t);
  synchronize(ctx);
  std::vector<profile::StageTiming> stages = run(ctx);
  synchronize(ctx);
  return stages;
#else
  MODMOE_FAIL() << "modmoe-profile: this build has no CUDA backend (device " << o.device.str()
                << ")";
  return {};
#endif
}

// ---- output -------------------------------------------------------------------------------------

void print_table(const std::vector<profile::StageTiming>& stages, const std::string& clock) {
  const double total = stages.empty() ? 0 : stages.front().duration_us;
  std::printf("%-28s %12s %12s %8s\n", "stage", "start (us)", "dur (us)", "% total");
  for (const auto& s : stages) {
    const std::string name = std::string(2 * s.depth, ' ') + s.name;
    std::printf("%-28s %12.3f %12.3f %7.1f%%\n", name.c_str(), s.start_us, s.duration_us,
                total > 0 ? 100.0 * s.duration_us / total : 0.0);
  }
  std::printf(
      "(%s; a stage's %% is of the whole forward, nested stages are part of their parent)\n",
      clock.c_str());
}

std::string fixed3(double v) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.3f", std::isfinite(v) ? v : 0.0);
  return buf;
}

// Chrome trace format: complete ("X") events, microseconds; nesting is by time on one thread.
std::string chrome_trace(const std::vector<profile::StageTiming>& stages,
                         const bench::JsonObject& metadata) {
  std::vector<std::string> events;
  for (const auto& s : stages) {
    std::ostringstream e;
    e << "{\"name\": " << bench::json_string(s.name) << ", \"cat\": \"modmoe\", \"ph\": \"X\""
      << ", \"ts\": " << fixed3(s.start_us) << ", \"dur\": " << fixed3(s.duration_us)
      << ", \"pid\": 0, \"tid\": 0, \"args\": {\"depth\": " << s.depth << "}}";
    events.push_back(e.str());
  }
  bench::JsonObject root;
  root.add("traceEvents", bench::json_array(events, 2));
  root.str("displayTimeUnit", "ms");
  root.add("metadata", metadata.dump(2));
  return root.dump() + "\n";
}

int run(int argc, char** argv) {
  const Options o = parse_args(argc, argv);
  if (o.help) {
    std::cout << kUsage;
    return kExitOk;
  }
  if (o.pf_type.empty() || o.experts_type.empty()) {
    throw UsageError("--pf-type and --experts-type are required (--help lists the options)");
  }
  if (o.num_local_experts && *o.num_local_experts > o.config.num_experts) {
    throw UsageError("--num-local-experts must be <= --num-experts");
  }
  if (const Compatibility r = check_config(o.config); !r) {
    throw UsageError("invalid configuration: " + r.reason);
  }
  if (o.device.is_cuda() && !cuda_available()) {
    throw UsageError("--device " + o.device.str() +
                     ": no CUDA device is visible, or this build has no CUDA backend");
  }
  ModularKernel kernel = [&] {
    try {
      return make_modular_kernel(o.pf_type, o.experts_type, o.config, o.device);
    } catch (const Error& e) {  // unknown or incompatible parts: the caller's choice
      throw UsageError(e.what());
    }
  }();

  testing::ProblemSpec spec;
  spec.config = o.config;
  spec.M = o.M;
  spec.seed = o.seed;
  spec.use_expert_map = o.num_local_experts.has_value();
  const testing::Problem problem = testing::make_problem(spec);

  std::unique_ptr<profile::ProfileTracer> tracer;
  std::string clock;
  if (o.device.is_cpu()) {
    tracer = std::make_unique<profile::CpuProfileTracer>();
    clock = "cpu wall clock (steady_clock)";
  } else {
    tracer = profile::make_cuda_profile_tracer();
    clock = "cuda events on the forward's stream";
  }
  const std::vector<profile::StageTiming> stages = profile_forward(kernel, problem, o, *tracer);

  const std::string experts = kernel.experts().name();
  std::cout << "modmoe-profile: " << kernel.prepare_finalize().name() << " + " << experts << " ["
            << o.config.str() << "] M=" << o.M << " on " << o.device.str() << ", " << o.warmup
            << " warm-up forward(s)\n";
  print_table(stages, clock);

  if (!o.out.empty()) {
    bench::JsonObject meta;
    meta.str("tool", "modmoe-profile")
        .str("prepare_finalize", kernel.prepare_finalize().name())
        .str("experts", experts)
        .str("config", o.config.str())
        .num("M", o.M)
        .num("K", o.config.hidden_size)
        .num("N", o.config.intermediate_size)
        .num("num_experts", o.config.num_experts)
        .num("num_local_experts", o.config.num_local_experts)
        .num("topk", o.config.topk)
        .str("dtype", dtype_name(o.config.in_dtype))
        .str("quant", o.config.quant.str())
        .str("activation", activation_name(o.config.activation))
        .str("device", o.device.str())
        .str("clock", clock)
        .num("warmup", o.warmup)
        .num("seed", static_cast<int64_t>(o.seed));
    if (o.chunk_size) meta.num("chunk_size", *o.chunk_size);
    std::ofstream file(o.out);
    file << chrome_trace(stages, meta);
    file.close();
    MODMOE_CHECK(file.good()) << "modmoe-profile: could not write --out " << o.out;
    std::cout << "modmoe-profile: wrote " << stages.size() << " stages to " << o.out << "\n";
  }
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const UsageError& e) {
    std::cerr << "modmoe-profile: " << e.what() << "\n";
    return kExitUsage;
  } catch (const std::exception& e) {
    std::cerr << "modmoe-profile: " << e.what() << "\n";
    return kExitFail;
  }
}
