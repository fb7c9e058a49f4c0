#include "cli_case.h"

#include <exception>
#include <iostream>

#include "modmoe/activation.h"
#include "modmoe/cuda.h"
#include "modmoe/quant.h"

#if MODMOE_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace modmoe::cli {

MoEConfig default_config() {
  MoEConfig c;
  c.num_experts = 8;
  c.num_local_experts = 8;
  c.hidden_size = 256;
  c.intermediate_size = 128;
  c.topk = 2;
  c.in_dtype = DType::bf16;
  return c;
}

testing::Problem make_case_problem(const CaseSpec& spec) {
  testing::ProblemSpec ps;
  ps.config = spec.config;
  ps.M = spec.M;
  ps.seed = spec.seed;
  ps.use_expert_map = spec.use_expert_map;
  return testing::make_problem(ps);
}

int run_main(const std::string& tool, int (*run)(int, char**), int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const UsageError& e) {
    std::cerr << tool << ": " << e.what() << "\n";
    return kExitUsage;
  } catch (const std::exception& e) {
    std::cerr << tool << ": " << e.what() << "\n";
    return kExitFail;
  }
}

// ---- flags --------------------------------------------------------------------------------------

int64_t parse_int(const std::string& flag, const std::string& text) {
  try {
    size_t used = 0;
    const long long v = std::stoll(text, &used);
    if (used == text.size()) return v;
  } catch (const std::exception&) {
  }
  throw UsageError(flag + " expects an integer, got '" + text + "'");
}

double parse_double(const std::string& flag, const std::string& text) {
  try {
    size_t used = 0;
    const double v = std::stod(text, &used);
    if (used == text.size() && v > 0) return v;
  } catch (const std::exception&) {
  }
  throw UsageError(flag + " expects a positive number, got '" + text + "'");
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

namespace {

int64_t positive(const std::string& flag, const std::string& text) {
  const int64_t v = parse_int(flag, text);
  if (v < 1) throw UsageError(flag + " must be >= 1, got " + text);
  return v;
}

}  // namespace

FlagTable case_flag_table(CaseArgs& a) {
  a.spec.config = default_config();
  MoEConfig& c = a.spec.config;
  using S = const std::string&;
  return {
      {"--help", {false, false, [&a](S, S) { a.help = true; }}},
      {"-h", {false, false, [&a](S, S) { a.help = true; }}},
      {"--seed",
       {true, false,
        [&a](S flag, S v) {
          const int64_t seed = parse_int(flag, v);
          if (seed < 0) throw UsageError("--seed must be >= 0, got " + v);
          a.spec.seed = static_cast<uint64_t>(seed);
        }}},
      {"--device", {true, false, [&a](S, S v) { a.device = parse_device(v); }}},
      {"--pf-type", {true, true, [&a](S, S v) { a.pf_type = v; }}},
      {"--experts-type", {true, true, [&a](S, S v) { a.experts_type = v; }}},
      {"-m", {true, true, [&a](S flag, S v) { a.spec.M = positive(flag, v); }}},
      {"-k", {true, true, [&c](S flag, S v) { c.hidden_size = positive(flag, v); }}},
      {"-n", {true, true, [&c](S flag, S v) { c.intermediate_size = positive(flag, v); }}},
      {"--num-experts", {true, true, [&c](S flag, S v) { c.num_experts = positive(flag, v); }}},
      {"--num-local-experts",
       {true, true, [&a](S flag, S v) { a.num_local_experts = positive(flag, v); }}},
      {"--topk", {true, true, [&c](S flag, S v) { c.topk = positive(flag, v); }}},
      {"--dtype", {true, true, [&c](S, S v) { c.in_dtype = parse_in_dtype(v); }}},
      {"--quant",
       {true, true,
        [&c](S flag, S v) { c.quant.scheme = parse_choice(flag, v, parse_quant_scheme); }}},
      {"--static-scale", {false, true, [&c](S, S) { c.quant.static_act_scale = true; }}},
      {"--activation",
       {true, true, [&c](S flag, S v) { c.activation = parse_choice(flag, v, parse_activation); }}},
      {"--layout",
       {true, true,
        [&c](S flag, S v) { c.gated_layout = parse_choice(flag, v, parse_gated_layout); }}},
      {"--max-tokens", {true, true, [&a](S flag, S v) { a.spec.max_tokens = positive(flag, v); }}},
      {"--chunk-size", {true, true, [&a](S flag, S v) { a.spec.chunk_size = parse_int(flag, v); }}},
  };
}

std::vector<std::string> parse_flags(const FlagTable& flags, int argc, char** argv) {
  std::vector<std::string> case_flags;
  std::map<std::string, int> seen;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
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
    const Flag& f = it->second;
    if (f.case_flag) case_flags.push_back(flag);
    if (!f.takes_value) {
      if (value) throw UsageError(flag + " takes no value");
      f.set(flag, "");
      continue;
    }
    if (!value) {
      if (i + 1 >= argc) throw UsageError(flag + " expects a value");
      value = argv[++i];
    }
    f.set(flag, *value);
  }
  return case_flags;
}

void finish_case_args(CaseArgs& a) {
  a.spec.use_expert_map = a.num_local_experts.has_value();
  a.spec.config.num_local_experts = a.num_local_experts.value_or(a.spec.config.num_experts);
}

// ---- running on a device ------------------------------------------------------------------------

#if MODMOE_WITH_CUDA
struct DeviceProblem::Stream {
  explicit Stream(const std::string& tool) {
    const cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    MODMOE_CHECK(e == cudaSuccess)
        << tool << ": cudaStreamCreateWithFlags failed: " << cudaGetErrorString(e);
  }
  ~Stream() { cudaStreamDestroy(stream); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  cudaStream_t stream = nullptr;
};
#else
struct DeviceProblem::Stream {};
#endif

DeviceProblem::DeviceProblem(const testing::Problem& p, Device device, const std::string& tool) {
  args_.hidden_states = p.hidden_states;
  args_.topk_weights = p.topk_weights;
  args_.topk_ids = p.topk_ids;
  args_.output = p.output;
  args_.weights = p.weights();
  args_.expert_map = p.expert_map;
  if (device.is_cpu()) {
    ctx_ = Context::cpu();
    return;
  }
#if MODMOE_WITH_CUDA
  stream_ = std::make_unique<Stream>(tool);
  ctx_ = cuda_context(device.index, stream_->stream);
  Allocator* alloc = cuda_default_allocator(device.index);
  storage_.reserve(16);
  auto to_device = [&](const Tensor& host) -> Tensor {
    if (!host.defined()) return Tensor();
    storage_.emplace_back(alloc, host.dtype(), host.shape(), ctx_.stream);
    copy_tensor(ctx_, storage_.back(), host);
    return storage_.back().tensor();
  };
  args_.hidden_states = to_device(args_.hidden_states);
  args_.topk_weights = to_device(args_.topk_weights);
  args_.topk_ids = to_device(args_.topk_ids);
  args_.output = to_device(args_.output);  // carries the host poison over
  args_.expert_map = to_device(args_.expert_map);
  ExpertWeights& w = args_.weights;
  for (Tensor* t : {&w.w13, &w.w2, &w.w13_scale, &w.w2_scale, &w.a13_scale, &w.a2_scale})
    *t = to_device(*t);
  synchronize(ctx_);
#else
  MODMOE_FAIL() << tool << ": this build has no CUDA backend (device " << device.str() << ")";
#endif
}

DeviceProblem::~DeviceProblem() = default;

void DeviceProblem::synchronize_if_cuda() {
  if (ctx_.device.is_cuda()) synchronize(ctx_);
}

void DeviceProblem::copy_output_to(const Tensor& host_output) {
  if (!ctx_.device.is_cuda()) return;
  copy_tensor(ctx_, host_output, args_.output);
  synchronize(ctx_);
}

}  // namespace modmoe::cli
