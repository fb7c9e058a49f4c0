// `modmoe-bench --gemm` (bench_sm90.h): the Hopper grouped GEMM alone, on GPU 0.
//
// Data: weights are random on the device (bf16 N(0, 1/K), or e4m3 codes with random 128x128
// block scales of the same magnitude, as the suite makes them: quantizing 15 GB of DeepSeek-V3
// weights through the CPU-only quantize_weights would take minutes); activations are random
// bf16, quantized for fp8 by the public quantize_activations on the GPU (1x128 groups).
// Everything is generated outside the timed graphs.
//
// Timing: each variant runs once eagerly (outputs poisoned with NaN first) and is compared with
// the portable kernel's output for the same inputs (relative RMS difference), then is captured
// in a CUDA graph (global mode) and replayed `replays` times, each replay between its own pair
// of events, the L2 overwritten before each (outside the events).
//
// Workspace: each Experts part's workspace_shapes() for the three full layers, computed (not
// timed) at the start of the run, before any kernel can break the context.
//
// The parts: bench_sm90_cases.h (what they share), bench_sm90_measure.cu, bench_sm90_fc1.cu,
// bench_sm90_scheduler.cu, bench_sm90_report.cu; here: the ceilings and the run.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <exception>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "bench_cublas.h"
#include "bench_device.h"
#include "bench_json.h"
#include "bench_kernels.h"
#include "bench_sm90.h"
#include "bench_sm90_cases.h"
#include "modmoe/cuda.h"
#include "modmoe/moe_gemm.h"

namespace modmoe::bench {

namespace gemm_bench {
namespace {

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

Ceilings measure_ceilings(cudaStream_t stream) {
  Ceilings c;
  size_t free_bytes = 0, total_bytes = 0;
  BENCH_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
  c.read_bytes = std::min<size_t>(size_t(4) << 30, free_bytes / 4) / 16 * 16;
  c.read_bw = measure_read_bandwidth(c.read_bytes, stream);
  Cublas cublas(stream);
  c.peaks = measure_gemm_peaks(cublas, 8192, 10);
  return c;
}

// Runs `body` for one case, turning an exception into the case's error; a lost context ends
// the run (returns false).
template <typename Case, typename Body>
bool guarded(Case& c, Body&& body) {
  try {
    body();
    return true;
  } catch (const ContextLost& e) {
    c.error = e.what();
    return false;
  } catch (const std::exception& e) {
    c.error = e.what();
    try {
      ensure_context_alive(e.what());
    } catch (const ContextLost& lost) {
      c.error += std::string(" [") + lost.what() + "]";
      return false;
    }
    return true;
  }
}

// What the run measures: the default (or --quick) sets, narrowed by the options' subsets.
struct Selection {
  std::vector<const Fc1Shape*> shapes;
  std::vector<int64_t> rows_per_expert, decode_ms;
  std::vector<DType> dtypes;
  std::string error;  // an unknown name or a bad number, said in full
};

Selection select_cases(const GemmBenchOptions& o) {
  Selection s;
  std::ostringstream why;
  if (o.shapes.empty()) {
    s.shapes = {&kFc1Shapes[0]};
    if (!o.quick) s.shapes = {&kFc1Shapes[0], &kFc1Shapes[1], &kFc1Shapes[2]};
  }
  for (const std::string& name : o.shapes) {
    const Fc1Shape* found = nullptr;
    for (const Fc1Shape& shape : kFc1Shapes)
      if (name == shape.name) found = &shape;
    if (found == nullptr) {
      why << "unknown --gemm shape '" << name << "'; the FC1 shapes are";
      for (const Fc1Shape& shape : kFc1Shapes) why << " " << shape.name;
      s.error = why.str();
      return s;
    }
    s.shapes.push_back(found);
  }
  s.rows_per_expert = !o.rows_per_expert.empty() ? o.rows_per_expert
                      : o.quick                  ? std::vector<int64_t>{1, 128}
                                                 : std::vector<int64_t>{1, 64, 128, 256, 1024};
  s.decode_ms = !o.decode_ms.empty() ? o.decode_ms
                : o.quick            ? std::vector<int64_t>{1, 16}
                                     : std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64};
  if (s.decode_ms == std::vector<int64_t>{0}) s.decode_ms.clear();  // {0}: no scheduler study
  for (int64_t v : s.rows_per_expert)
    if (v < 1) s.error = "--rows values must be >= 1, got " + std::to_string(v);
  for (int64_t v : s.decode_ms)
    if (v < 1) s.error = "--decode-ms values must be >= 1 (or the single value 0), got " +
                         std::to_string(v);
  if (o.dtypes.empty()) s.dtypes = {DType::bf16, DType::fp8_e4m3};
  for (const std::string& d : o.dtypes) {
    if (d == "bf16") {
      s.dtypes.push_back(DType::bf16);
    } else if (d == "fp8") {
      s.dtypes.push_back(DType::fp8_e4m3);
    } else {
      s.error = "unknown --gemm-dtypes value '" + d + "'; expected bf16 or fp8";
    }
  }
  return s;
}

}  // namespace
}  // namespace gemm_bench

int run_gemm_bench(const GemmBenchOptions& o) {
  using namespace gemm_bench;  // the cases, how they are measured and reported
  MODMOE_CHECK(o.replays >= 1) << "modmoe-bench --gemm: replays must be >= 1, got " << o.replays;
  if (const Selection sel = select_cases(o); !sel.error.empty()) {
    std::fprintf(stderr, "modmoe-bench --gemm: %s\n", sel.error.c_str());
    return 2;
  }
  if (!cuda_available()) {
    std::printf("modmoe-bench --gemm: skipped: no CUDA device is visible\n");
    return 0;
  }
  BENCH_CUDA(cudaSetDevice(0));
  cudaStream_t stream = nullptr;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const DeviceInfo info = device_info();
  const Context ctx = cuda_context(0, stream);
  if (!moe_gemm_sm90_available(ctx)) {
    std::printf(
        "modmoe-bench --gemm: skipped: the Hopper kernel cannot run here (%s, sm_%d%d; this "
        "build's sm90 tiles: %s); it needs compute capability 9.0 and a build with "
        "CMAKE_CUDA_ARCHITECTURES=90a\n",
        info.name.c_str(), info.cc_major, info.cc_minor,
        moe_gemm_sm90_tiles().empty() ? "none" : "present");
    cudaStreamDestroy(stream);
    return 0;
  }
  std::printf("modmoe-bench --gemm: %s, %d SMs, sm_%d%d, L2 %.0f MB; sm90 tiles:",
              info.name.c_str(), info.sm_count, info.cc_major, info.cc_minor, info.l2_bytes / 1e6);
  for (const std::string& t : moe_gemm_sm90_tiles()) std::printf(" %s", t.c_str());
  std::printf("\n");
  if (o.replays < 20)
    std::printf("note: %d replays per variant (< 20: not for the record)\n", o.replays);

  L2Flush flush_buffer = o.flush_l2 ? L2Flush(info.l2_bytes, o.flush_kind) : L2Flush();
  Env env{o,
          stream,
          ctx,
          info,
          measure_ceilings(stream),
          o.flush_l2 ? &flush_buffer : nullptr,
          DeviceBuffer(3 * sizeof(double)),
          DeviceBuffer(size_t(compare_partials()) * sizeof(double))};
  const Ceilings& ceil = env.ceilings;
  std::printf(
      "ceilings: read %.0f GB/s (%.1f GiB streamed); dense GEMM %lld^3: bf16 %.0f TFLOP/s, fp8 "
      "%.0f (per-tensor %.0f, block %.0f)%s%s\n",
      ceil.read_bw * 1e-9, ceil.read_bytes / double(1 << 30),
      static_cast<long long>(ceil.peaks.size), ceil.peaks.bf16_tflops, ceil.tflops(DType::fp8_e4m3),
      ceil.peaks.fp8_tensor_tflops, ceil.peaks.fp8_block_tflops,
      ceil.peaks.notes.empty() ? "" : "; ", ceil.peaks.notes.c_str());
  std::fflush(stdout);

  const Selection sel = select_cases(o);
  const std::vector<const Fc1Shape*>& shapes = sel.shapes;
  const std::vector<int64_t>& rows_per_expert = sel.rows_per_expert;
  const std::vector<int64_t>& decode_Ms = sel.decode_ms;
  const std::vector<DType>& dtypes = sel.dtypes;

  // The workspace study first: it only sizes buffers (no kernel runs), so a case that later
  // breaks the CUDA context cannot take it down. Its errors stay in its rows; never a failure.
  const std::vector<WorkspaceCase> workspace = run_workspace_study(env);
  int workspace_problems = 0;
  for (const WorkspaceCase& c : workspace)
    workspace_problems += !c.sm90.error.empty() + !c.portable.error.empty();
  std::printf("workspace: %zu rows (Sm90Experts, CudaExperts via the registry), %d errors\n",
              workspace.size(), workspace_problems);
  std::fflush(stdout);

  std::vector<Fc1Case> fc1;
  std::vector<SchedulerCase> sched;
  bool alive = true;
  for (const Fc1Shape* s : shapes) {
    for (DType dtype : dtypes) {
      if (!alive) break;
      const uint64_t wseed = mix(o.seed * 131 + uint64_t(s - kFc1Shapes) * 7 + int(dtype));
      Weights w;
      std::string weights_error;
      try {
        w = make_weights(dtype, *s, wseed, stream);
      } catch (const std::exception& e) {
        weights_error = std::string("generating weights: ") + e.what();
      }
      for (int64_t R : rows_per_expert) {
        Fc1Case c;
        c.shape = s;
        c.dtype = dtype;
        c.rows_per_expert = R;
        c.rows = s->E * R;
        if (!weights_error.empty()) {
          c.error = weights_error;
        } else {
          alive = guarded(c, [&] { run_fc1_case(env, c, w, mix(wseed + uint64_t(R))); });
        }
        if (c.error.empty()) {
          std::printf(
              "fc1 %-16s %-4s rows/expert %4lld: fused %s us (%s), unfused %s us, portable %s "
              "us%s%s; max rel diff %.1e\n",
              s->name, dtype_label(dtype), static_cast<long long>(R), cell(c.fused).c_str(),
              c.tile_fused.c_str(), cell(c.unfused).c_str(), cell(c.portable).c_str(),
              dtype == DType::fp8_e4m3 ? ", fp8-out " : "",
              dtype == DType::fp8_e4m3 ? cell(c.fp8_out).c_str() : "",
              worst_diff({&c.fused, &c.unfused, &c.fp8_out}));
          for (const Measured* m : {&c.fused, &c.unfused, &c.fp8_out}) {
            if (!m->error.empty()) std::printf("    error: %s\n", m->error.c_str());
            if (m->not_applicable) std::printf("    n/a: %s\n", m->note.c_str());
          }
        } else {
          std::printf("fc1 %-16s %-4s rows/expert %4lld: ERROR %s\n", s->name, dtype_label(dtype),
                      static_cast<long long>(R), c.error.c_str());
        }
        std::fflush(stdout);
        fc1.push_back(std::move(c));
        if (!alive) break;
      }
      w = Weights();
      trim_device_memory();
    }
  }

  for (DType dtype : dtypes) {
    if (!alive) break;
    const uint64_t wseed = mix(o.seed * 977 + int(dtype));
    Weights w;
    std::string weights_error;
    try {
      w = make_weights(dtype, kDecodeShape, wseed, stream);
    } catch (const std::exception& e) {
      weights_error = std::string("generating weights: ") + e.what();
    }
    for (int64_t M : decode_Ms) {
      SchedulerCase c;
      c.dtype = dtype;
      c.M = M;
      if (!weights_error.empty()) {
        c.error = weights_error;
      } else {
        alive = guarded(c, [&] { run_scheduler_case(env, c, w, mix(wseed + uint64_t(M))); });
      }
      if (c.error.empty()) {
        std::printf(
            "scheduler %-4s M=%-3lld (%lld rows, %lld experts): ideal %s us, cooperative %s, "
            "linear scan %s, precomputed+build %s; max rel diff %.1e\n",
            dtype_label(dtype), static_cast<long long>(M), static_cast<long long>(c.rows),
            static_cast<long long>(c.experts_hit), cell(c.ideal, "%.2f").c_str(),
            cell(c.cooperative, "%.2f").c_str(), cell(c.linear_scan, "%.2f").c_str(),
            cell(c.precomputed, "%.2f").c_str(),
            worst_diff({&c.ideal, &c.cooperative, &c.linear_scan, &c.precomputed}));
        for (const Measured* m : {&c.ideal, &c.cooperative, &c.linear_scan, &c.precomputed}) {
          if (!m->error.empty()) std::printf("    error: %s\n", m->error.c_str());
        }
      } else {
        std::printf("scheduler %-4s M=%-3lld: ERROR %s\n", dtype_label(dtype),
                    static_cast<long long>(M), c.error.c_str());
      }
      std::fflush(stdout);
      sched.push_back(std::move(c));
      if (!alive) break;
    }
    w = Weights();
    trim_device_memory();
  }

  int failures = 0;
  for (const Fc1Case& c : fc1) failures += c.failed();
  for (const SchedulerCase& c : sched) failures += c.failed();
  const Targets targets = evaluate(fc1, sched, ceil.read_bw);

  if (!o.json_path.empty()) {
    JsonObject device;
    device.str("name", info.name)
        .num("sm_count", int64_t(info.sm_count))
        .str("compute_capability",
             std::to_string(info.cc_major) + "." + std::to_string(info.cc_minor))
        .num("l2_bytes", int64_t(info.l2_bytes))
        .num("memory_bytes", int64_t(info.memory_bytes))
        .num("cuda_runtime", int64_t(info.runtime))
        .num("cuda_driver", int64_t(info.driver));
    std::vector<std::string> tiles;
    for (const std::string& t : moe_gemm_sm90_tiles()) tiles.push_back(json_string(t));
    JsonObject settings;
    settings.num("replays", int64_t(o.replays))
        .flag("flush_l2", o.flush_l2)
        .str("flush_kind", l2_flush_kind_name(o.flush_kind))
        .num("settle_ms", int64_t(settle_ms()))
        .num("seed", int64_t(o.seed))
        .flag("quick", o.quick)
        .add("sm90_tiles", json_array(tiles, 4));
    JsonObject ceilings;
    ceilings.num("read_bw_GBps", ceil.read_bw * 1e-9)
        .num("read_bw_bytes", int64_t(ceil.read_bytes))
        .num("gemm_size", ceil.peaks.size)
        .num("bf16_tflops", ceil.peaks.bf16_tflops)
        .num("fp8_tensor_tflops", ceil.peaks.fp8_tensor_tflops)
        .num("fp8_block_tflops", ceil.peaks.fp8_block_tflops)
        .num("fp8_tflops_used", ceil.tflops(DType::fp8_e4m3))
        .str("notes", ceil.peaks.notes);
    std::vector<std::string> cases;
    for (const Fc1Case& c : fc1) cases.push_back(fc1_json(c, ceil, ceil.read_bw));
    for (const SchedulerCase& c : sched) cases.push_back(scheduler_json(c, ceil.read_bw));
    std::vector<std::string> workspace_rows;
    for (const WorkspaceCase& c : workspace) workspace_rows.push_back(workspace_json(c));
    JsonObject root;
    root.str("tool", "modmoe-bench-gemm")
        .str("date", utc_now())
        .add("device", device.dump(2))
        .add("settings", settings.dump(2))
        .add("ceilings", ceilings.dump(2))
        .add("summary", JsonObject()
                            .num("fc1_cases", int64_t(fc1.size()))
                            .num("scheduler_cases", int64_t(sched.size()))
                            .num("failed_cases", int64_t(failures))
                            .num("workspace_rows", int64_t(workspace.size()))
                            .num("workspace_errors", int64_t(workspace_problems))
                            .flag("complete", alive)
                            .dump(2))
        .add("targets", targets_json(targets))
        .add("cases", json_array(cases, 2))
        .add("workspace", json_array(workspace_rows, 2));
    std::ofstream f(o.json_path);
    f << root.dump() << "\n";
    MODMOE_CHECK(f.good()) << "modmoe-bench --gemm: could not write " << o.json_path;
    std::printf("wrote %s\n", o.json_path.c_str());
  }

  std::printf(
      "\nceilings: read %.0f GB/s; bf16 %.0f TFLOP/s; fp8 %.0f TFLOP/s; %d replays per variant, "
      "L2 %s\n",
      ceil.read_bw * 1e-9, ceil.peaks.bf16_tflops, ceil.tflops(DType::fp8_e4m3), o.replays,
      o.flush_l2 ? "flushed" : "not flushed");
  print_fc1_table(fc1, env);
  print_scheduler_table(sched, env);
  print_workspace_table(workspace);
  print_targets(targets);
  std::printf("\ngemm: %zu fc1 + %zu scheduler cases, %d failed (error or wrong output)%s\n",
              fc1.size(), sched.size(), failures,
              alive ? "" : "; CUDA context lost, run cut short");
  cudaStreamDestroy(stream);
  return (failures || !alive) ? 1 : 0;
}

}  // namespace modmoe::bench
