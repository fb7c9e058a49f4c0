// What modmoe-check and modmoe-profile share: the flags that describe one case (a random
// problem for one pair), their parser, and running a problem on a device.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "modmoe/context.h"
#include "modmoe/error.h"
#include "modmoe/modular_kernel.h"
#include "oracle/problem.h"

namespace modmoe::cli {

// A usage error: the tools print it with their name and exit with code 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One configuration to run a pair on.
struct CaseSpec {
  MoEConfig config;  // num_local_experts == num_experts unless use_expert_map
  int64_t M = 64;
  bool use_expert_map = false;
  std::optional<int64_t> max_tokens;  // batched parts; default M
  std::optional<int64_t> chunk_size;  // Context::chunk_size; default: the Context's
  uint64_t seed = 1;
  std::optional<double> tol;  // modmoe-check's pass threshold; default by dtype and quant
};

// E=8, K=256, N=128, topk 2, bf16, no quantization.
MoEConfig default_config();

// The random problem of `spec` (testing::make_problem).
testing::Problem make_case_problem(const CaseSpec& spec);

// Exit codes both tools share (0 is success).
constexpr int kExitFail = 1;   // the run failed: wrong numbers, an exception
constexpr int kExitUsage = 2;  // a usage error, an unknown part or an incompatible pair

// main() of a tool: returns run(argc, argv); an exception that escapes it is printed on stderr
// after "<tool>: " and exits with kExitUsage for a UsageError, kExitFail for anything else.
int run_main(const std::string& tool, int (*run)(int, char**), int argc, char** argv);

// ---- flags --------------------------------------------------------------------------------------

int64_t parse_int(const std::string& flag, const std::string& text);
// A number > 0.
double parse_double(const std::string& flag, const std::string& text);
// bf16 | fp16 | fp32.
DType parse_in_dtype(const std::string& text);
// "cpu", "cuda" (GPU 0) or "cuda:N".
Device parse_device(const std::string& text);

// Library parsers throw modmoe::Error listing the valid choices; report them as usage errors.
template <typename Parse>
auto parse_choice(const std::string& flag, const std::string& text, Parse parse) {
  try {
    return parse(text);
  } catch (const Error& e) {
    throw UsageError(flag + ": " + e.what());
  }
}

// A flag: whether it takes a value, whether it describes one case (modmoe-check refuses those
// with --all), and what it sets (given the flag as typed, for messages, and its value).
struct Flag {
  bool takes_value;
  bool case_flag;
  std::function<void(const std::string& flag, const std::string& value)> set;
};
using FlagTable = std::map<std::string, Flag>;

// What the shared flags set. The tools' own options extend it.
struct CaseArgs {
  bool help = false;
  std::string pf_type, experts_type;
  Device device = Device::cpu();
  CaseSpec spec;                             // config starts as default_config()
  std::optional<int64_t> num_local_experts;  // --num-local-experts as given
};

// --help/-h, --pf-type, --experts-type, the shape, dtype, quant and activation flags,
// --max-tokens, --chunk-size, --seed and --device, all writing into `args` (which must outlive
// the table). Sets args.spec.config to default_config().
FlagTable case_flag_table(CaseArgs& args);

// Parses argv[1..] against `flags` ("--flag value" or "--flag=value"; each flag at most once)
// and returns the case flags given, in order. Throws UsageError.
std::vector<std::string> parse_flags(const FlagTable& flags, int argc, char** argv);

// After parsing: --num-local-experts turns on the expert_map, otherwise all experts are local.
void finish_case_args(CaseArgs& args);

// ---- running on a device ------------------------------------------------------------------------

// The forward arguments of a problem on `device`, with the Context to run them in. On the CPU
// they are the problem's own tensors; on a GPU, device copies (the output with its host poison)
// made on a fresh non-blocking stream (forward never uses the legacy default stream), synchronized
// before the constructor returns. `tool` names the program in error messages.
class DeviceProblem {
 public:
  DeviceProblem(const testing::Problem& problem, Device device, const std::string& tool);
  ~DeviceProblem();
  DeviceProblem(const DeviceProblem&) = delete;
  DeviceProblem& operator=(const DeviceProblem&) = delete;

  Context& context() { return ctx_; }
  const ForwardArgs& args() const { return args_; }
  // Waits for the GPU stream; nothing on the CPU.
  void synchronize_if_cuda();
  // Copies the output into `host_output` (on a GPU; on the CPU it already is there), synchronized.
  void copy_output_to(const Tensor& host_output);

 private:
  struct Stream;                    // CUDA only: the stream, destroyed after the tensors
  std::unique_ptr<Stream> stream_;  // declared first: destroyed last
  Context ctx_;
  std::vector<OwnedTensor> storage_;  // device copies, freed on the stream
  ForwardArgs args_;
};

}  // namespace modmoe::cli
