// What the parts of `modmoe-bench --gemm` (bench_sm90.h) share: the FC1 shapes, the tolerances
// and targets, the record of one measured variant and of each case, and the functions that fill
// them. The parts: bench_sm90_measure.cu (one variant measured and checked, the operands),
// bench_sm90_fc1.cu (fused vs unfused FC1), bench_sm90_scheduler.cu (the scheduler at decode),
// bench_sm90_report.cu (tables, targets, JSON, and the workspace study, which is computed from
// the parts' declared workspaces, not timed), bench_sm90.cu (the run).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_cublas.h"
#include "bench_device.h"
#include "bench_sm90.h"
#include "modmoe/context.h"
#include "modmoe/moe_gemm.h"
#include "modmoe/tensor.h"

namespace modmoe::bench::gemm_bench {

// Relative RMS difference allowed against the portable kernel. A bf16 output differs only by
// accumulation order and one bf16 rounding (the unfused path rounds the 2N-wide intermediate
// too); an e4m3 output carries its own rounding (3 mantissa bits: ~2.5% RMS) on top.
inline constexpr double kTolerance = 1e-2;
inline constexpr double kFp8OutTolerance = 5e-2;

// The targets (reported, never failed).
inline constexpr double kFusedSpeedupTarget = 1.25;  // Qwen3.5-35B shape, 1024 rows per expert
inline constexpr double kSchedulerOverheadTarget = 0.10;
inline constexpr double kDeepSeekFp8TflopsTarget = 1300;  // >= 512 rows per expert
inline constexpr double kDecodeStreamTarget = 0.90;       // weight GB/s over the read ceiling

struct Fc1Shape {
  const char* name;
  int64_t E, K, N2;  // w13 (E, N2, K); the gated output is N2 / 2 wide
};
inline constexpr Fc1Shape kFc1Shapes[] = {
    {"qwen3.5-35b-a3b", 256, 2048, 1024},
    {"qwen3-235b-a22b", 128, 4096, 3072},
    {"deepseek-v3", 256, 7168, 4096},
};
// The decode scheduler study: Qwen3.5-35B-A3B's FC1 with its routing (topk 8 of 256).
inline constexpr Fc1Shape kDecodeShape = kFc1Shapes[0];
inline constexpr int64_t kDecodeTopk = 8;

// Thrown when the CUDA context is broken (a kernel faulted): nothing after it can be trusted.
class ContextLost : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline const char* dtype_label(DType d) { return d == DType::bf16 ? "bf16" : "fp8"; }

struct Ceilings {
  double read_bw = 0;  // bytes/s, the streaming-read kernel
  size_t read_bytes = 0;
  GemmPeaks peaks;
  // The dense rate a case of this dtype is measured against; fp8: the better of cuBLASLt's two
  // fp8 GEMMs, as the suite does (2x bf16 when neither ran).
  double tflops(DType d) const {
    if (d == DType::bf16) return peaks.bf16_tflops;
    const double fp8 = std::max(peaks.fp8_tensor_tflops, peaks.fp8_block_tflops);
    return fp8 > 0 ? fp8 : 2 * peaks.bf16_tflops;
  }
};

// What the whole run shares.
struct Env {
  const GemmBenchOptions& o;
  cudaStream_t stream;
  Context ctx;
  DeviceInfo info;
  Ceilings ceilings;
  L2Flush* flush;
  DeviceBuffer stats, partials;  // compare_bf16's scratch
};

// Clears a pending launch error; throws ContextLost when the context itself is broken.
void ensure_context_alive(const std::string& after);

struct Diff {
  double rel = NAN;         // ||out - ref|| / ||ref||
  int64_t non_finite = -1;  // of out
};

// out and ref: n bf16 values on the device.
Diff compare(Env& env, const void* out, const void* ref, int64_t n);

// Fills the buffer with 0xff bytes: NaN in bf16, e4m3 and fp32.
void poison(const DeviceBuffer& b, cudaStream_t stream);

// A view of the buffer as a tensor on cuda:0.
Tensor on_gpu(const DeviceBuffer& b, DType dtype, const Shape& shape);

// One timed variant of a case.
struct Measured {
  bool attempted = false;
  bool not_applicable = false;  // the kernel declined it (reason in `note`)
  std::string error, note;
  Diff diff;
  double tolerance = kTolerance;
  Timing time;
  size_t graph_nodes = 0;

  bool timed() const { return time.replays > 0; }
  bool correct() const { return diff.non_finite == 0 && diff.rel <= tolerance; }
  bool failed() const { return attempted && !not_applicable && (!error.empty() || !correct()); }
  double us() const { return timed() ? time.median_us : NAN; }
};

// Poisons the outputs, runs `enqueue` once, checks it, then times a graph of it. With
// `declinable`, a modmoe::Error from the eager run means "not applicable", not a failure.
void measure(Env& env, Measured& m, const std::function<void()>& poison_outputs,
             const std::function<void()>& enqueue, const std::function<Diff()>& check,
             bool declinable = false);

// ---- operands -----------------------------------------------------------------------------------

struct Weights {  // b (E, N2, K) and, for fp8, b_scale (E, N2/128, K/128)
  DeviceBuffer b, b_scale;
  Tensor tb, tb_scale;
  double bytes_per_expert = 0;
};

// Random weights of the shape on the device, as the suite makes them (see bench_sm90.cu).
Weights make_weights(DType dtype, const Fc1Shape& s, uint64_t seed, cudaStream_t stream);

struct Activations {  // a (rows, K) and, for fp8, a_scale (rows, K/128)
  DeviceBuffer a, a_scale;
  Tensor ta, ta_scale;
  double bytes = 0;
};

// Random bf16 activations (rows, K), quantized by quantize_activations for fp8.
Activations make_activations(const Env& env, DType dtype, int64_t rows, int64_t K, uint64_t seed);

// ---- fused vs unfused FC1 -----------------------------------------------------------------------

struct Fc1Case {
  const Fc1Shape* shape = nullptr;
  DType dtype = DType::bf16;
  int64_t rows_per_expert = 0, rows = 0;
  std::string tile_fused, tile_unfused, tile_fp8_out;
  double flops = 0, weight_bytes = 0, bytes = 0;
  // fp8 only, mx: the fused FC1 with MX-FP8 scales (e8m0 per 32 along K) instead of block-128
  // ones, same codes, checked against the portable kernel's MX result.
  Measured fused, unfused, portable, fp8_out, mx;
  std::string error;  // the case could not be set up (or its reference is broken)

  double speedup() const { return unfused.us() / fused.us(); }
  double mx_cost() const { return mx.us() / fused.us(); }  // MX time over block-128 time
  double vs_portable() const { return portable.us() / fused.us(); }
  double tflops() const { return flops / (fused.us() * 1e-6) * 1e-12; }
  double weight_gbps() const { return weight_bytes / (fused.us() * 1e-6) * 1e-9; }
  bool decode() const { return rows_per_expert == 1; }
  bool failed() const {
    return !error.empty() || fused.failed() || unfused.failed() || portable.failed() ||
           fp8_out.failed() || mx.failed();
  }
};

// Fills `c` (its shape, dtype and rows per expert given): the portable reference, then the
// fused, unfused and (fp8) fp8-out and MX variants, each checked against its reference and timed.
void run_fc1_case(Env& env, Fc1Case& c, const Weights& w, uint64_t seed);

// ---- the scheduler at decode --------------------------------------------------------------------

struct SchedulerCase {
  DType dtype = DType::bf16;
  int64_t M = 0, rows = 0, experts_hit = 0;
  std::string tile;
  double flops = 0, weight_bytes = 0;
  Measured ideal, cooperative, linear_scan, precomputed, portable;
  std::string error;

  double overhead(const Measured& m) const { return m.us() / ideal.us() - 1.0; }
  double weight_gbps() const { return weight_bytes / (cooperative.us() * 1e-6) * 1e-9; }
  bool failed() const {
    return !error.empty() || ideal.failed() || cooperative.failed() || linear_scan.failed() ||
           precomputed.failed() || portable.failed();
  }
};

// Fills `c` (its dtype and M given): M decode tokens routed topk of E, the portable reference,
// then the same sm90 kernel with each scheduler against the precomputed-list ideal.
void run_scheduler_case(Env& env, SchedulerCase& c, const Weights& w, uint64_t seed);

// ---- peak workspace bytes per forward (bench_sm90_report.cu) ----------------------------------

// The full MoE layers behind the three FC1 shapes: w13 (E, 2N, K), w2 (E, K, N), every token
// routed to 8 experts; no expert parallelism (E_local = E).
inline constexpr int64_t kLayerTopk = 8;
inline constexpr int64_t kWorkspaceMs[] = {1, 16, 128, 1024, 8192};

// One Experts part's memory for one forward of M tokens, as ModularKernel::forward allocates
// it (src/core/modular_kernel.cpp): workspace13 and workspace2 for a chunk of tokens, plus the
// fused-output buffer when the part's output cannot go straight into the caller's output or
// into workspace13. The P/F's quantized input (a1q) and the caller's output are not counted.
struct WorkspacePart {
  const char* name = "";
  std::string skipped;  // the part refused the config (check_part / config_check), or not here
  std::string error;    // building it or workspace_shapes() threw
  int64_t chunk = 0;    // tokens per apply(): the workspaces are sized for this many
  int64_t ws13_bytes = -1, ws2_bytes = -1;
  int64_t output_bytes = -1;  // the fused-output buffer forward allocates besides (often 0)

  bool ok() const { return skipped.empty() && error.empty() && ws13_bytes >= 0; }
  int64_t total_bytes() const { return ok() ? ws13_bytes + ws2_bytes + output_bytes : -1; }
};

struct WorkspaceCase {
  const Fc1Shape* shape = nullptr;
  DType dtype = DType::bf16;  // bf16: unquantized; fp8_e4m3: the fp8_block scheme
  int64_t M = 0;
  // M * topk * (max(2N, K) + max(N, K)) elements of 2 bytes: the GEMM1 output (2N) / GEMM2
  // output (K) buffer and the activation output (N) buffer of an unfused path. Those hold GEMM
  // outputs, which an unfused fp8 path keeps in bf16 too (only the operands are e4m3), so fp8
  // counts 2 bytes as well: counting 1 would understate the unfused path.
  double unfused_bytes = 0;
  // "Sm90Experts", the same with reduce_in_gemm2 (GEMM2 adds into (M, K) token rows: no
  // (M * topk, K) buffer), "CudaExperts"
  WorkspacePart sm90, sm90_fold, portable;

  static double ratio(const WorkspacePart& p, double reference) {
    return p.ok() ? double(p.total_bytes()) / reference : NAN;
  }
};

// Every shape x kWorkspaceMs x {bf16, fp8 block}, from the parts' workspace_shapes() on GPU 0
// (the CUB scratch size they include is the device's). Never throws: a part that fails records
// its error in its row.
std::vector<WorkspaceCase> run_workspace_study(const Env& env);

// ---- report (bench_sm90_report.cu) --------------------------------------------------------------

// "-" for a variant that did not run or time, "n/a" for one the kernel declined.
std::string cell(const Measured& m, const char* fmt = "%.1f");

// The largest relative difference among the variants that ran (0 when none did).
double worst_diff(std::initializer_list<const Measured*> ms);

std::string fc1_json(const Fc1Case& c, const Ceilings& ceil, double read_bw);
std::string scheduler_json(const SchedulerCase& c, double read_bw);

void print_fc1_table(const std::vector<Fc1Case>& cases, const Env& env);
void print_scheduler_table(const std::vector<SchedulerCase>& cases, const Env& env);
void print_workspace_table(const std::vector<WorkspaceCase>& cases);
std::string workspace_json(const WorkspaceCase& c);

// The targets, from the measured cases (NAN where the case did not run).
struct Targets {
  double fused_speedup_qwen35_1024[2] = {NAN, NAN};  // bf16, fp8
  int fused_slower = 0, fused_compared = 0;
  double coop_overhead_max[2] = {NAN, NAN};
  double deepseek_fp8_tflops = NAN;  // the largest rows-per-expert >= 512 measured
  double decode_stream_min = NAN;    // weight GB/s / read BW over the decode cases
};

Targets evaluate(const std::vector<Fc1Case>& fc1, const std::vector<SchedulerCase>& sched,
                 double read_bw);
void print_targets(const Targets& t);
std::string targets_json(const Targets& t);

}  // namespace modmoe::bench::gemm_bench
