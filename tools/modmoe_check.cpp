// modmoe-check: runs registered (PrepareAndFinalize, Experts) pairs against the float64 oracle,
// like vLLM's test_modular_kernel_combinations.py (--pf-type / --experts-type).
//
//   modmoe-check --list                          the catalog, with capabilities
//   modmoe-check --pf-type X --experts-type Y …  one pair, one configuration
//   modmoe-check --all [--quick]                 every pair × a fixed set of configurations
//   ... --device cuda                            the same on the GPU: the CUDA parts run on
//                                                device copies of the problem
//
// Exit codes: 0 passed; 1 a compatible case failed (wrong numbers or an exception);
// 2 usage error, unknown part, or (single case) an incompatible pair.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cli_case.h"
#include "modmoe/context.h"
#include "modmoe/cuda.h"
#include "modmoe/error.h"
#include "modmoe/modular_kernel.h"
#include "modmoe/registry.h"
#include "oracle/oracle.h"
#include "oracle/problem.h"

namespace {

using namespace modmoe;
using namespace modmoe::cli;

constexpr int kExitPass = 0;

constexpr const char* kUsage = R"(usage:
  modmoe-check --list
  modmoe-check --pf-type P --experts-type X [options]
  modmoe-check --all [--quick] [--seed S] [--device D]

Runs a modular kernel built from registered parts and compares it with the float64 oracle
(relative error over the whole output and per expert). --device picks the backend: cpu (the
default) or cuda, where the problem is copied to GPU 0, run there and copied back. --all
checks the pairs whose parts both exist on that backend.

options (one case):
  --pf-type P             a registered PrepareAndFinalize (see --list)
  --experts-type X        a registered Experts, or 'auto' (the first that composes with P)
  -m M                    tokens (default 64)
  -k K                    hidden size (default 256)
  -n N                    intermediate size per expert (default 128)
  --num-experts E         global experts (default 8)
  --num-local-experts EL  local experts, EL <= E; uses a random expert_map
  --topk T                experts per token (default 2)
  --dtype D               bf16 | fp16 | fp32 (default bf16)
  --quant Q               none | fp8-tensor | fp8-token | fp8-block | mxfp8 (default none)
  --static-scale          static activation scales (fp8-tensor only)
  --activation A          silu | gelu | gelu_tanh | swigluoai | silu_no_mul | gelu_no_mul |
                          gelu_tanh_no_mul | swigluoai_no_mul (default silu)
  --layout L              gate_up | up_gate | interleaved (default gate_up)
  --max-tokens T          config.max_num_tokens (batched parts; default M)
  --chunk-size C          Context::chunk_size, tokens per Experts::apply (<= 0: no limit)
  --seed S                seed of the random problem (default 1)
  --device D              cpu | cuda (default cpu)
  --tol X                 pass threshold (default: fp32 1e-4, bf16/fp16 1e-2, fp8 3e-2)

exit status: 0 pass, 1 fail, 2 usage error or incompatible pair
)";

// ARCHITECTURE.md §9: fp8 schemes 3e-2; bf16/fp16 outputs 1e-2; fp32 without quantization 1e-4.
double default_tolerance(const MoEConfig& c) {
  if (c.quant.quantized()) return 3e-2;
  return c.in_dtype == DType::fp32 ? 1e-4 : 1e-2;
}

bool is_batched(const PartCapabilities& part) { return part.format == ActivationFormat::Batched; }

// The config the pair is checked and built with: batched parts need max_num_tokens.
MoEConfig config_for_pair(const PartCapabilities& pf, const PartCapabilities& ex,
                          const CaseSpec& spec) {
  MoEConfig c = spec.config;
  if (spec.max_tokens) {
    c.max_num_tokens = *spec.max_tokens;
  } else if (is_batched(pf) || is_batched(ex)) {
    c.max_num_tokens = spec.M;
  }
  return c;
}

// "[E=8 K=256 ...] M=64" (+ chunk) for result lines.
std::string case_label(const MoEConfig& c, const CaseSpec& spec) {
  std::ostringstream s;
  s << "[" << c.str() << (spec.use_expert_map ? " expert_map" : "") << "] M=" << spec.M;
  if (spec.chunk_size) s << " chunk=" << *spec.chunk_size;
  return s.str();
}

// The command line that reruns one case, printed under a failure.
std::string reproducer(const std::string& pf, const std::string& ex, const CaseSpec& spec,
                       Device device) {
  const MoEConfig& c = spec.config;
  std::ostringstream s;
  s << "modmoe-check --pf-type " << pf << " --experts-type " << ex << " -m " << spec.M << " -k "
    << c.hidden_size << " -n " << c.intermediate_size << " --num-experts " << c.num_experts;
  if (spec.use_expert_map) s << " --num-local-experts " << c.num_local_experts;
  s << " --topk " << c.topk << " --dtype " << dtype_name(c.in_dtype) << " --quant "
    << quant_scheme_name(c.quant.scheme) << (c.quant.static_act_scale ? " --static-scale" : "")
    << " --activation " << activation_name(c.activation) << " --layout "
    << gated_layout_name(c.gated_layout);
  if (spec.max_tokens) s << " --max-tokens " << *spec.max_tokens;
  if (spec.chunk_size) s << " --chunk-size " << *spec.chunk_size;
  s << " --seed " << spec.seed;
  if (spec.tol) s << " --tol " << *spec.tol;
  if (device.is_cuda()) s << " --device " << device.str();
  return s.str();
}

// A problem and its oracle output, shared by every pair run on one configuration.
// Dynamic per-tensor intermediate scales are taken per Experts::apply call, so experts that
// chunk the tokens are held to a reference quantized chunk by chunk.
struct Reference {
  testing::Problem problem;
  std::vector<double> expected;          // one apply over all tokens
  std::vector<double> expected_chunked;  // one apply per chunk (empty without --chunk-size)
};

Reference make_reference(const CaseSpec& spec) {
  Reference ref{make_case_problem(spec), {}};
  oracle::OracleInputs in = ref.problem.oracle_inputs();
  ref.expected = oracle::moe_forward(in);
  if (spec.chunk_size && *spec.chunk_size > 0) {
    in.chunk_size = *spec.chunk_size;
    ref.expected_chunked = oracle::moe_forward(in);
  }
  return ref;
}

enum class Outcome { pass, fail, incompatible };

// Checks the pair for the case; when incompatible, prints the reason and makes sure
// make_modular_kernel refuses it with that same reason (the catalog must not disagree with
// itself).
Outcome check_pair(const PrepareFinalizeEntry& pf, const ExpertsEntry& ex, const MoEConfig& config,
                   const std::string& where, Device device) {
  const Compatibility compat = check_compatibility(pf.caps, ex.caps, config, device);
  if (compat) return Outcome::pass;
  std::cout << "INCOMPATIBLE " << pf.caps.name << " + " << ex.caps.name << where << ": "
            << compat.reason << "\n";
  try {
    make_modular_kernel(pf.caps.name, ex.caps.name, config, device);
  } catch (const Error& e) {
    if (std::string(e.what()).find(compat.reason) != std::string::npos) {
      return Outcome::incompatible;
    }
    std::cout << "FAIL " << pf.caps.name << " + " << ex.caps.name << where
              << ": make_modular_kernel refused with another reason: " << e.what() << "\n";
    return Outcome::fail;
  }
  std::cout << "FAIL " << pf.caps.name << " + " << ex.caps.name << where
            << ": make_modular_kernel built a pair that check_compatibility rejects\n";
  return Outcome::fail;
}

// Runs one forward of `kernel` on the problem and returns its wall time in seconds (the GPU
// forward is synchronized before the clock stops). On a GPU the inputs and the poisoned output
// are copied to device buffers and the output is copied back into p.output.
double forward_on(const ModularKernel& kernel, const testing::Problem& p, const CaseSpec& spec,
                  Device device) {
  DeviceProblem on_device(p, device, "modmoe-check");
  Context& ctx = on_device.context();
  if (spec.chunk_size) ctx.chunk_size = *spec.chunk_size;
  const auto start = std::chrono::steady_clock::now();
  kernel.forward(ctx, on_device.args());
  on_device.synchronize_if_cuda();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  on_device.copy_output_to(p.output);
  return seconds;
}

// Runs a compatible pair on `ref` and prints one PASS/FAIL line.
Outcome run_pair(const PrepareFinalizeEntry& pf, const ExpertsEntry& ex, const MoEConfig& config,
                 const CaseSpec& spec, const Reference& ref, Device device) {
  const std::string head = pf.caps.name + " + " + ex.caps.name + " " + case_label(config, spec);
  const double tol = spec.tol ? *spec.tol : default_tolerance(config);
  const testing::Problem& p = ref.problem;
  try {
    const ModularKernel kernel = make_modular_kernel(pf.caps.name, ex.caps.name, config, device);
    testing::poison(p.output);  // a previous pair may have written it
    const double seconds = forward_on(kernel, p, spec, device);
    const bool chunked = kernel.experts().supports_chunking() && !ref.expected_chunked.empty();
    const oracle::ErrorReport report = oracle::compare(
        p.output, chunked ? ref.expected_chunked : ref.expected, p.topk_ids, p.expert_map);
    const bool ok = report.passed(tol);
    char timing[64];
    std::snprintf(timing, sizeof(timing), " (%.4f s)", seconds);
    std::cout << (ok ? "PASS " : "FAIL ") << head << ": " << report.str() << timing;
    if (!ok) std::cout << " > tol " << tol;
    std::cout << "\n";
    if (!ok) {
      std::cout << "  reproduce: " << reproducer(pf.caps.name, ex.caps.name, spec, device) << "\n";
    }
    return ok ? Outcome::pass : Outcome::fail;
  } catch (const std::exception& e) {
    std::cout << "FAIL " << head << ": threw: " << e.what() << "\n"
              << "  reproduce: " << reproducer(pf.caps.name, ex.caps.name, spec, device) << "\n";
    return Outcome::fail;
  }
}

// ---- argument parsing ---------------------------------------------------------------------------

std::string join_names(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

std::vector<std::string> pf_names() {
  std::vector<std::string> names;
  for (const auto& p : prepare_finalize_registry()) names.push_back(p.caps.name);
  return names;
}

std::vector<std::string> experts_names() {
  std::vector<std::string> names;
  for (const auto& p : experts_registry()) names.push_back(p.caps.name);
  return names;
}

// The tool's own options on top of the shared case flags.
struct Options : CaseArgs {
  bool list = false, all = false, quick = false;
  std::vector<std::string> case_flags;  // given flags that describe one case (not for --all)
};

Options parse_args(int argc, char** argv) {
  Options o;
  FlagTable flags = case_flag_table(o);
  using S = const std::string&;
  flags.insert({
      {"--list", {false, false, [&o](S, S) { o.list = true; }}},
      {"--all", {false, false, [&o](S, S) { o.all = true; }}},
      {"--quick", {false, false, [&o](S, S) { o.quick = true; }}},
      {"--tol", {true, true, [&o](S flag, S v) { o.spec.tol = parse_double(flag, v); }}},
  });
  o.case_flags = parse_flags(flags, argc, argv);
  finish_case_args(o);
  return o;
}
// ---- modes --------------------------------------------------------------------------------------

int list_parts() {
  std::cout << "PrepareAndFinalize (" << prepare_finalize_registry().size() << "):\n";
  for (const auto& p : prepare_finalize_registry()) std::cout << "  " << describe(p.caps) << "\n";
  std::cout << "Experts (" << experts_registry().size() << "):\n";
  for (const auto& p : experts_registry()) std::cout << "  " << describe(p.caps) << "\n";
  return kExitPass;
}

int run_one(const Options& o) {
  const PrepareFinalizeEntry* pf = find_prepare_finalize(o.pf_type);
  if (pf == nullptr) {
    throw UsageError("unknown --pf-type '" + o.pf_type +
                     "'; registered PrepareAndFinalize parts: " + join_names(pf_names()));
  }
  const ExpertsEntry* ex = nullptr;
  if (o.experts_type == "auto") {
    std::string reasons;
    for (const auto& candidate : experts_registry()) {  // registered best-first
      const Compatibility r = check_compatibility(
          pf->caps, candidate.caps, config_for_pair(pf->caps, candidate.caps, o.spec), o.device);
      if (r) {
        ex = &candidate;
        break;
      }
      reasons += "\n  " + r.reason;
    }
    if (ex == nullptr) {
      std::cout << "INCOMPATIBLE " << pf->caps.name
                << " + auto: no registered Experts composes:" << reasons << "\n";
      return kExitUsage;
    }
  } else {
    ex = find_experts(o.experts_type);
    if (ex == nullptr) {
      throw UsageError("unknown --experts-type '" + o.experts_type +
                       "'; registered Experts parts: " + join_names(experts_names()) + ", auto");
    }
  }
  const MoEConfig config = config_for_pair(pf->caps, ex->caps, o.spec);
  if (const Compatibility r = check_config(config); !r) {
    throw UsageError("invalid configuration: " + r.reason);
  }
  if (config.max_num_tokens > 0 && config.max_num_tokens < o.spec.M &&
      (is_batched(pf->caps) || is_batched(ex->caps))) {
    throw UsageError("--max-tokens " + std::to_string(config.max_num_tokens) +
                     " is below M = " + std::to_string(o.spec.M) +
                     "; a single rank sends all M tokens, so batched parts need max_tokens >= M");
  }
  switch (check_pair(*pf, *ex, config, "", o.device)) {
    case Outcome::incompatible:
      return kExitUsage;
    case Outcome::fail:
      return kExitFail;
    case Outcome::pass:
      break;
  }
  Reference ref;
  try {
    ref = make_reference(o.spec);
  } catch (const std::exception& e) {
    std::cout << "FAIL " << pf->caps.name << " + " << ex->caps.name << " "
              << case_label(config, o.spec) << ": building the problem threw: " << e.what() << "\n";
    return kExitFail;
  }
  return run_pair(*pf, *ex, config, o.spec, ref, o.device) == Outcome::pass ? kExitPass : kExitFail;
}

// The configurations of --all: every quant scheme (fp8-tensor also static), bf16 and fp32
// (one fp16), aligned and odd shapes, an expert_map, _no_mul and other activations/layouts,
// decode-sized and chunked batches. Small enough to run in well under a minute on 2 cores.
struct AllCase {
  bool quick;  // part of --all --quick
  CaseSpec spec;
};

std::vector<AllCase> all_cases(uint64_t seed) {
  struct CaseShape {
    int64_t E, EL, K, N, topk, M;  // EL == 0: all E local, no expert_map
  };
  auto make = [seed](bool quick, CaseShape s, DType dtype, QuantScheme scheme,
                     bool static_scale = false, Activation act = Activation::silu,
                     GatedLayout layout = GatedLayout::GateUp,
                     std::optional<int64_t> chunk = std::nullopt) {
    AllCase a{quick, {}};
    MoEConfig& c = a.spec.config;
    c.num_experts = s.E;
    c.num_local_experts = s.EL > 0 ? s.EL : s.E;
    c.hidden_size = s.K;
    c.intermediate_size = s.N;
    c.topk = s.topk;
    c.in_dtype = dtype;
    c.quant.scheme = scheme;
    c.quant.static_act_scale = static_scale;
    c.activation = act;
    c.gated_layout = layout;
    a.spec.M = s.M;
    a.spec.use_expert_map = s.EL > 0;
    a.spec.chunk_size = chunk;
    a.spec.seed = seed;
    return a;
  };
  using Q = QuantScheme;
  using A = Activation;
  using L = GatedLayout;
  const DType bf16 = DType::bf16, fp32 = DType::fp32, fp16 = DType::fp16;
  const CaseShape base{8, 0, 256, 128, 2, 64};
  return {
      make(true, base, bf16, Q::none),
      make(true, {8, 0, 256, 128, 1, 1}, fp32, Q::none),   // decode, topk 1
      make(false, {64, 0, 128, 64, 8, 7}, fp32, Q::none),  // topk 8, few tokens
      make(true, base, bf16, Q::fp8_tensor),
      make(true, base, bf16, Q::fp8_tensor, /*static_scale=*/true),
      make(false, base, fp32, Q::fp8_tensor, /*static_scale=*/true),
      make(false, base, bf16, Q::fp8_token),
      make(true, {16, 0, 384, 256, 4, 64}, bf16, Q::fp8_block),
      make(false, {8, 0, 256, 192, 2, 33}, fp32, Q::fp8_block),  // N = 1.5 blocks
      make(true, {8, 0, 256, 192, 2, 64}, bf16, Q::mxfp8),
      make(false, {8, 0, 128, 64, 2, 16}, fp16, Q::fp8_token, false, A::gelu, L::UpGate),
      // gpt-oss-like odd hidden size: K = 22.5 blocks of 128, 90 MX groups.
      make(true, {8, 0, 2880, 64, 2, 16}, bf16, Q::none),
      make(false, {8, 0, 2880, 96, 4, 16}, bf16, Q::fp8_block, false, A::swigluoai, L::Interleaved),
      make(false, {8, 0, 2880, 64, 2, 12}, fp32, Q::mxfp8),
      make(true, {64, 16, 256, 128, 8, 300}, bf16, Q::none),  // expert_map, 16 of 64 local
      make(false, {64, 24, 256, 128, 8, 100}, fp32, Q::fp8_token),
      make(true, base, bf16, Q::none, false, A::silu_no_mul),
      make(false, base, fp32, Q::none, false, A::gelu_tanh_no_mul),
      make(false, {32, 0, 256, 256, 4, 40}, bf16, Q::none, false, A::swigluoai, L::Interleaved),
      make(true, {64, 0, 256, 128, 8, 300}, bf16, Q::none, false, A::silu, L::GateUp, 64),
      make(false, {16, 0, 256, 128, 4, 300}, bf16, Q::fp8_block, false, A::silu, L::GateUp, 50),
      make(false, {16, 0, 256, 128, 4, 200}, bf16, Q::fp8_tensor, true, A::silu, L::GateUp, 64),
  };
}

bool on_backend(const PartCapabilities& part, Backend backend) {
  for (Backend b : part.backends)
    if (b == backend) return true;
  return false;
}

int run_all(const Options& o) {
  const Backend backend = backend_of(o.device);
  // Pairs with a part that has no implementation on this backend are left out (once, not per
  // case: that is a property of the catalog, not of a configuration).
  int elsewhere = 0;
  for (const auto& pf : prepare_finalize_registry())
    for (const auto& ex : experts_registry())
      elsewhere += !(on_backend(pf.caps, backend) && on_backend(ex.caps, backend));
  int passed = 0, failed = 0, incompatible = 0;
  for (const AllCase& a : all_cases(o.spec.seed)) {
    if (o.quick && !a.quick) continue;
    std::optional<Reference> ref;  // built on first use, shared by the compatible pairs
    for (const auto& pf : prepare_finalize_registry()) {
      for (const auto& ex : experts_registry()) {
        if (!on_backend(pf.caps, backend) || !on_backend(ex.caps, backend)) continue;
        const MoEConfig config = config_for_pair(pf.caps, ex.caps, a.spec);
        const Outcome checked =
            check_pair(pf, ex, config, " " + case_label(config, a.spec), o.device);
        if (checked != Outcome::pass) {
          (checked == Outcome::incompatible ? incompatible : failed) += 1;
          continue;
        }
        if (!ref) {
          try {
            ref = make_reference(a.spec);
          } catch (const std::exception& e) {
            std::cout << "FAIL " << pf.caps.name << " + " << ex.caps.name << " "
                      << case_label(config, a.spec) << ": building the problem threw: " << e.what()
                      << "\n";
            ++failed;
            continue;
          }
        }
        (run_pair(pf, ex, config, a.spec, *ref, o.device) == Outcome::pass ? passed : failed) += 1;
        std::cout.flush();
      }
    }
  }
  std::cout << "modmoe-check: " << passed << " passed, " << failed << " failed, " << incompatible
            << " incompatible";
  if (elsewhere > 0) {
    std::cout << "; " << elsewhere << " pairs have no " << backend_name(backend)
              << " implementation";
  }
  std::cout << "\n";
  if (passed == 0) {  // a check that checked nothing must not pass
    std::cout << "modmoe-check: no pair ran on " << backend_name(backend) << "\n";
    return kExitFail;
  }
  return failed == 0 ? kExitPass : kExitFail;
}

int run(int argc, char** argv) {
  const Options o = parse_args(argc, argv);
  if (o.help) {
    std::cout << kUsage;
    return kExitPass;
  }
  const int modes = int(o.list) + int(o.all) + int(!o.pf_type.empty() || !o.experts_type.empty());
  if (modes != 1) {
    throw UsageError("give exactly one of --list, --all, or --pf-type with --experts-type");
  }
  if (o.quick && !o.all) throw UsageError("--quick goes with --all");
  if (o.list) return list_parts();
  if (o.device.is_cuda() && !cuda_available()) {
    throw UsageError("--device " + o.device.str() +
                     ": no CUDA device is visible, or this build has no CUDA backend");
  }
  if (o.all) {
    if (!o.case_flags.empty()) {
      throw UsageError("--all takes only --quick, --seed and --device, got " +
                       o.case_flags.front());
    }
    return run_all(o);
  }
  if (o.pf_type.empty() || o.experts_type.empty()) {
    throw UsageError("--pf-type and --experts-type go together; registered PrepareAndFinalize: " +
                     join_names(pf_names()) + "; Experts: " + join_names(experts_names()));
  }
  return run_one(o);
}

}  // namespace

int main(int argc, char** argv) { return modmoe::cli::run_main("modmoe-check", run, argc, argv); }
