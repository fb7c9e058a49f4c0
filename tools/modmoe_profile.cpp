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
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bench_json.h"
#include "cli_case.h"
#include "modmoe/activation.h"
#include "modmoe/context.h"
#include "modmoe/cuda.h"
#include "modmoe/error.h"
#include "modmoe/modular_kernel.h"
#include "modmoe/quant.h"
#include "modmoe/registry.h"
#include "oracle/problem.h"
#include "profile_tracers.h"

namespace {

using namespace modmoe;
using namespace modmoe::cli;

constexpr int kExitOk = 0;

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

// The tool's own options on top of the shared case flags.
struct Options : CaseArgs {
  int64_t warmup = 3;
  std::string out;
};

Options parse_args(int argc, char** argv) {
  Options o;
  FlagTable flags = case_flag_table(o);
  using S = const std::string&;
  flags.insert({
      {"--warmup",
       {true, false,
        [&o](S flag, S v) {
          o.warmup = parse_int(flag, v);
          if (o.warmup < 0) throw UsageError("--warmup must be >= 0, got " + v);
        }}},
      {"--out", {true, false, [&o](S, S v) { o.out = v; }}},
  });
  parse_flags(flags, argc, argv);
  finish_case_args(o);
  // Standard parts ignore max_num_tokens; batched ones need it, and one rank sends all M tokens.
  o.spec.config.max_num_tokens = o.spec.max_tokens.value_or(o.spec.M);
  return o;
}

// ---- running ------------------------------------------------------------------------------------

// Runs `warmup` untraced forwards, then one inside a "forward" range on `tracer`, and returns
// the recorded stages (the GPU stream is synchronized first).
std::vector<profile::StageTiming> profile_forward(const ModularKernel& kernel,
                                                  const testing::Problem& p, const Options& o,
                                                  profile::ProfileTracer& tracer) {
  DeviceProblem on_device(p, o.device, "modmoe-profile");
  Context& ctx = on_device.context();
  if (o.spec.chunk_size) ctx.chunk_size = *o.spec.chunk_size;
  for (int64_t i = 0; i < o.warmup; ++i) kernel.forward(ctx, on_device.args());
  on_device.synchronize_if_cuda();
  tracer.clear();
  ctx.tracer = &tracer;
  {
    TraceRange range(ctx, "forward");
    kernel.forward(ctx, on_device.args());
  }
  ctx.tracer = nullptr;
  on_device.synchronize_if_cuda();
  return tracer.timings();
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
  if (o.num_local_experts && *o.num_local_experts > o.spec.config.num_experts) {
    throw UsageError("--num-local-experts must be <= --num-experts");
  }
  if (const Compatibility r = check_config(o.spec.config); !r) {
    throw UsageError("invalid configuration: " + r.reason);
  }
  if (o.device.is_cuda() && !cuda_available()) {
    throw UsageError("--device " + o.device.str() +
                     ": no CUDA device is visible, or this build has no CUDA backend");
  }
  ModularKernel kernel = [&] {
    try {
      return make_modular_kernel(o.pf_type, o.experts_type, o.spec.config, o.device);
    } catch (const Error& e) {  // unknown or incompatible parts: the caller's choice
      throw UsageError(e.what());
    }
  }();

  const testing::Problem problem = make_case_problem(o.spec);

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
            << o.spec.config.str() << "] M=" << o.spec.M << " on " << o.device.str() << ", "
            << o.warmup << " warm-up forward(s)\n";
  print_table(stages, clock);

  if (!o.out.empty()) {
    bench::JsonObject meta;
    meta.str("tool", "modmoe-profile")
        .str("prepare_finalize", kernel.prepare_finalize().name())
        .str("experts", experts)
        .str("config", o.spec.config.str())
        .num("M", o.spec.M)
        .num("K", o.spec.config.hidden_size)
        .num("N", o.spec.config.intermediate_size)
        .num("num_experts", o.spec.config.num_experts)
        .num("num_local_experts", o.spec.config.num_local_experts)
        .num("topk", o.spec.config.topk)
        .str("dtype", dtype_name(o.spec.config.in_dtype))
        .str("quant", o.spec.config.quant.str())
        .str("activation", activation_name(o.spec.config.activation))
        .str("device", o.device.str())
        .str("clock", clock)
        .num("warmup", o.warmup)
        .num("seed", static_cast<int64_t>(o.spec.seed));
    if (o.spec.chunk_size) meta.num("chunk_size", *o.spec.chunk_size);
    std::ofstream file(o.out);
    file << chrome_trace(stages, meta);
    file.close();
    MODMOE_CHECK(file.good()) << "modmoe-profile: could not write --out " << o.out;
    std::cout << "modmoe-profile: wrote " << stages.size() << " stages to " << o.out << "\n";
  }
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) { return modmoe::cli::run_main("modmoe-profile", run, argc, argv); }
