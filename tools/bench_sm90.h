// `modmoe-bench --gemm`: the Hopper grouped GEMM (src/cuda/sm90/) on its own, on GPU 0.
//
//   1. the ceilings (streaming-read GB/s, dense cuBLAS bf16 / fp8 TFLOP/s), measured first;
//   2. fused gated FC1 (act(gate)*up in the epilogue) against the same kernel ungated + the
//      activation kernel, and the portable kernel as a reference, for three FC1 shapes x rows
//      per expert x {bf16, fp8 block}; plus the fp8-out fused variant for fp8 inputs;
//   3. the MoE scheduler at decode: cooperative and linear scan against the same kernel reading
//      a precomputed tile list built once outside the timed graph (the ideal);
//   4. GEMM-only roofline numbers: TFLOP/s against the dense ceiling, weight GB/s against the
//      read ceiling;
//   5. peak workspace bytes per forward of Sm90Experts and CudaExperts for three whole layers,
//      against an unfused path's M*topk*(max(2N, K) + max(N, K)) elements.
// Every timed variant is first run once and compared with the portable kernel's output.
// docs/gpu.md ("--gemm") describes the tables and the JSON.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench_device.h"

namespace modmoe::bench {

struct GemmBenchOptions {
  bool quick = false;    // one shape, rows per expert {1, 128}, decode tokens {1, 16}
  int replays = 30;      // timed graph replays per variant (median reported); >= 20 to record
  bool flush_l2 = true;  // evict the L2 before every timed replay
  L2FlushKind flush_kind = L2FlushKind::read;  // how (bench_device.h)
  uint64_t seed = 1;
  std::string json_path;  // empty: no JSON file
  // Subsets, for profiling one case (e.g. under ncu); empty = the default (or --quick) set.
  // shapes: FC1 shape names (kFc1Shapes); rows_per_expert: the FC1 study's; decode_ms: the
  // scheduler study's token counts ({0} skips it); dtypes: "bf16" and/or "fp8".
  std::vector<std::string> shapes, dtypes;
  std::vector<int64_t> rows_per_expert, decode_ms;
};

// Runs the whole GEMM benchmark and prints its tables last. Returns 0 when every case ran and
// matched the portable kernel (or when the Hopper kernel is not available here: it says so and
// skips), 1 otherwise, 2 for an unknown shape or dtype in the subsets. The performance targets are reported, never failed.
int run_gemm_bench(const GemmBenchOptions& options);

}  // namespace modmoe::bench
