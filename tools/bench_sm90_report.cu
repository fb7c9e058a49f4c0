// `modmoe-bench --gemm`, the report: the cases as JSON, the FC1 and scheduler tables, the
// issue's targets evaluated from the measured cases (reported, never failed), and the peak
// workspace of a forward per Experts part (computed from workspace_shapes(), not timed).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "bench_json.h"
#include "bench_sm90_cases.h"
#include "cuda/sm90/sm90_experts.h"
#include "modmoe/experts.h"
#include "modmoe/moe_gemm.h"
#include "modmoe/registry.h"

namespace modmoe::bench::gemm_bench {

namespace {

std::string measured_json(const Measured& m, double flops) {
  JsonObject j;
  if (!m.attempted) return "null";
  if (m.not_applicable) {
    j.flag("not_applicable", true).str("note", m.note);
    return j.dump(6);
  }
  j.num("time_us", m.us())
      .num("time_min_us", m.timed() ? m.time.min_us : NAN)
      .num("time_max_us", m.timed() ? m.time.max_us : NAN)
      .num("replays", int64_t(m.time.replays))
      .num("graph_nodes", int64_t(m.graph_nodes))
      .num("tflops", flops / (m.us() * 1e-6) * 1e-12)
      .num("rel_diff_vs_portable", m.diff.rel)
      .num("non_finite_outputs", m.diff.non_finite)
      .num("tolerance", m.tolerance)
      .flag("correct", m.correct());
  if (!m.error.empty()) j.str("error", m.error);
  return j.dump(6);
}

std::string number(double v, const char* fmt) {
  if (!std::isfinite(v)) return "-";
  char buf[32];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

// "" when the variant is fine or was not run; else what went wrong, for the notes column.
std::string problem(const char* name, const Measured& m) {
  if (!m.failed()) return "";
  return std::string(name) + (m.error.empty() ? ":WRONG " : ":ERROR ");
}

double nan_max(double a, double b) {
  return std::isnan(a) ? b : std::isnan(b) ? a : std::max(a, b);
}
double nan_min(double a, double b) {
  return std::isnan(a) ? b : std::isnan(b) ? a : std::min(a, b);
}

const char* verdict(bool measured, bool met) {
  return !measured ? "not measured" : met ? "met" : "MISSED";
}

}  // namespace

std::string fc1_json(const Fc1Case& c, const Ceilings& ceil, double read_bw) {
  JsonObject j;
  j.str("kind", "fc1")
      .str("shape", c.shape->name)
      .num("E", c.shape->E)
      .num("K", c.shape->K)
      .num("N2", c.shape->N2)
      .num("N_out", c.shape->N2 / 2)
      .str("dtype", dtype_label(c.dtype))
      .num("rows_per_expert", c.rows_per_expert)
      .num("rows", c.rows)
      .num("flops", c.flops)
      .num("weight_bytes", c.weight_bytes)
      .num("bytes", c.bytes)
      .str("tile_fused", c.tile_fused)
      .str("tile_unfused", c.tile_unfused);
  if (c.dtype == DType::fp8_e4m3) j.str("tile_fp8_out", c.tile_fp8_out);
  if (!c.error.empty()) j.str("error", c.error);
  const double floor_us =
      std::max(c.bytes / read_bw, c.flops / (ceil.tflops(c.dtype) * 1e12)) * 1e6;
  j.add("fused", measured_json(c.fused, c.flops))
      .add("unfused", measured_json(c.unfused, c.flops))
      .add("portable", measured_json(c.portable, c.flops))
      .add("fused_fp8_out", measured_json(c.fp8_out, c.flops))
      .add("fused_mx", measured_json(c.mx, c.flops))
      .num("mx_time_over_block128", c.mx_cost())
      .num("speedup_fused_vs_unfused", c.speedup())
      .num("speedup_fused_vs_portable", c.vs_portable())
      .num("fused_tflops", c.tflops())
      .num("dense_ceiling_tflops", ceil.tflops(c.dtype))
      .num("fraction_of_dense_ceiling", c.tflops() / ceil.tflops(c.dtype))
      .num("fused_weight_GBps", c.weight_gbps())
      .num("fraction_of_read_bw", c.weight_gbps() * 1e9 / read_bw)
      .num("floor_us", floor_us)
      .num("ratio_to_floor", c.fused.us() / floor_us)
      .flag("decode", c.decode());
  return j.dump(4);
}

std::string scheduler_json(const SchedulerCase& c, double read_bw) {
  JsonObject j;
  j.str("kind", "scheduler")
      .str("dtype", dtype_label(c.dtype))
      .num("E", kDecodeShape.E)
      .num("topk", kDecodeTopk)
      .num("K", kDecodeShape.K)
      .num("N2", kDecodeShape.N2)
      .num("M", c.M)
      .num("rows", c.rows)
      .num("experts_hit", c.experts_hit)
      .str("tile", c.tile)
      .num("flops", c.flops)
      .num("weight_bytes", c.weight_bytes);
  if (!c.error.empty()) j.str("error", c.error);
  j.add("ideal", measured_json(c.ideal, c.flops))
      .add("cooperative", measured_json(c.cooperative, c.flops))
      .add("linear_scan", measured_json(c.linear_scan, c.flops))
      .add("precomputed_with_build", measured_json(c.precomputed, c.flops))
      .add("portable", measured_json(c.portable, c.flops))
      .num("cooperative_overhead", c.overhead(c.cooperative))
      .num("linear_scan_overhead", c.overhead(c.linear_scan))
      .num("precomputed_with_build_overhead", c.overhead(c.precomputed))
      .num("cooperative_weight_GBps", c.weight_gbps())
      .num("fraction_of_read_bw", c.weight_gbps() * 1e9 / read_bw);
  return j.dump(4);
}

// "-" for a variant that did not run or time, "n/a" for one the kernel declined.
std::string cell(const Measured& m, const char* fmt) {
  if (m.not_applicable) return "n/a";
  if (!m.timed()) return m.attempted ? "ERR" : "-";
  char buf[32];
  std::snprintf(buf, sizeof(buf), fmt, m.us());
  return buf;
}

double worst_diff(std::initializer_list<const Measured*> ms) {
  double worst = 0;
  for (const Measured* m : ms)
    if (m->attempted && !m->not_applicable && std::isfinite(m->diff.rel))
      worst = std::max(worst, m->diff.rel);
  return worst;
}

void print_fc1_table(const std::vector<Fc1Case>& cases, const Env& env) {
  std::printf(
      "\nFC1 (gated, bf16 out): fused = sm90 gated; unfused = sm90 plain + activation_and_mul; "
      "portable = mma.sync gated; mx = fused with MX-FP8 scales (e8m0 per 32 along K), mx/f = its "
      "time over block-128's\n");
  std::printf("%-16s %-4s %5s %7s %-8s %10s %10s %5s %10s %5s %7s %5s %6s %5s %9s %9s %5s %8s %s\n",
              "shape", "dt", "r/exp", "rows", "tile", "fused_us", "unfused_us", "f/u", "portbl_us",
              "p/f", "TFLOP/s", "%peak", "wGB/s", "%BW", "fp8out_us", "mx_us", "mx/f", "max_diff",
              "notes");
  for (const Fc1Case& c : cases) {
    std::printf("%-16s %-4s %5lld %7lld %-8s ", c.shape->name, dtype_label(c.dtype),
                static_cast<long long>(c.rows_per_expert), static_cast<long long>(c.rows),
                c.tile_fused.c_str());
    if (!c.error.empty()) {
      std::printf("ERROR: %.100s\n", c.error.c_str());
      continue;
    }
    const double peak = env.ceilings.tflops(c.dtype);
    const bool fp8 = c.dtype == DType::fp8_e4m3;
    std::printf("%10s %10s %5s %10s %5s %7s %5s %6s %5s %9s %9s %5s %8.1e ", cell(c.fused).c_str(),
                cell(c.unfused).c_str(), number(c.speedup(), "%.2f").c_str(),
                cell(c.portable).c_str(), number(c.vs_portable(), "%.2f").c_str(),
                number(c.tflops(), "%.0f").c_str(), number(100 * c.tflops() / peak, "%.0f").c_str(),
                number(c.weight_gbps(), "%.0f").c_str(),
                number(100 * c.weight_gbps() * 1e9 / env.ceilings.read_bw, "%.0f").c_str(),
                fp8 ? cell(c.fp8_out).c_str() : "-", fp8 ? cell(c.mx).c_str() : "-",
                fp8 ? number(c.mx_cost(), "%.2f").c_str() : "-",
                worst_diff({&c.fused, &c.unfused, &c.fp8_out, &c.mx}));
    std::string notes = problem("fused", c.fused) + problem("unfused", c.unfused) +
                        problem("fp8out", c.fp8_out) + problem("mx", c.mx);
    if (c.speedup() < 1.0) notes += "fused-slower ";
    if (c.decode()) notes += "decode ";
    std::printf("%s\n", notes.c_str());
  }
}

void print_scheduler_table(const std::vector<SchedulerCase>& cases, const Env& env) {
  std::printf(
      "\nScheduler at decode (%s FC1, E=%lld, topk=%lld, gated): ideal = precomputed list built "
      "once outside the graph; overhead = t / ideal - 1\n",
      kDecodeShape.name, static_cast<long long>(kDecodeShape.E),
      static_cast<long long>(kDecodeTopk));
  std::printf("%-4s %4s %5s %4s %-8s %8s %8s %6s %9s %6s %10s %6s %9s %6s %5s %8s %s\n", "dt", "M",
              "rows", "hit", "tile", "ideal_us", "coop_us", "coop%", "linear_us", "lin%",
              "prebld_us", "pre%", "portbl_us", "wGB/s", "%BW", "max_diff", "notes");
  for (const SchedulerCase& c : cases) {
    std::printf("%-4s %4lld %5lld %4lld %-8s ", dtype_label(c.dtype), static_cast<long long>(c.M),
                static_cast<long long>(c.rows), static_cast<long long>(c.experts_hit),
                c.tile.c_str());
    if (!c.error.empty()) {
      std::printf("ERROR: %.100s\n", c.error.c_str());
      continue;
    }
    const double frac = c.weight_gbps() * 1e9 / env.ceilings.read_bw;
    std::printf("%8s %8s %6s %9s %6s %10s %6s %9s %6s %5s %8.1e ", cell(c.ideal, "%.2f").c_str(),
                cell(c.cooperative, "%.2f").c_str(),
                number(100 * c.overhead(c.cooperative), "%.1f").c_str(),
                cell(c.linear_scan, "%.2f").c_str(),
                number(100 * c.overhead(c.linear_scan), "%.1f").c_str(),
                cell(c.precomputed, "%.2f").c_str(),
                number(100 * c.overhead(c.precomputed), "%.1f").c_str(),
                cell(c.portable, "%.2f").c_str(), number(c.weight_gbps(), "%.0f").c_str(),
                number(100 * frac, "%.0f").c_str(),
                worst_diff({&c.ideal, &c.cooperative, &c.linear_scan, &c.precomputed}));
    std::string notes = problem("ideal", c.ideal) + problem("coop", c.cooperative) +
                        problem("linear", c.linear_scan) + problem("prebld", c.precomputed);
    if (c.overhead(c.cooperative) > kSchedulerOverheadTarget) notes += "coop>10% ";
    if (c.M <= 16 && frac < kDecodeStreamTarget) notes += "stream<90% ";
    std::printf("%s\n", notes.c_str());
  }
}

Targets evaluate(const std::vector<Fc1Case>& fc1, const std::vector<SchedulerCase>& sched,
                 double read_bw) {
  Targets t;
  for (const Fc1Case& c : fc1) {
    const int d = c.dtype == DType::bf16 ? 0 : 1;
    const double sp = c.speedup();
    if (std::isfinite(sp)) {
      ++t.fused_compared;
      t.fused_slower += sp < 1.0;
    }
    if (c.shape == &kFc1Shapes[0] && c.rows_per_expert == 1024) t.fused_speedup_qwen35_1024[d] = sp;
    if (c.shape == &kFc1Shapes[2] && d == 1 && c.rows_per_expert >= 512 &&
        std::isfinite(c.tflops()))
      t.deepseek_fp8_tflops = c.tflops();
    if (c.decode())
      t.decode_stream_min = nan_min(t.decode_stream_min, c.weight_gbps() * 1e9 / read_bw);
  }
  for (const SchedulerCase& c : sched) {
    const int d = c.dtype == DType::bf16 ? 0 : 1;
    t.coop_overhead_max[d] = nan_max(t.coop_overhead_max[d], c.overhead(c.cooperative));
    if (c.M <= 16)
      t.decode_stream_min = nan_min(t.decode_stream_min, c.weight_gbps() * 1e9 / read_bw);
  }
  return t;
}

void print_targets(const Targets& t) {
  std::printf("\ntargets (reported, not failed):\n");
  for (int d = 0; d < 2; ++d) {
    const double v = t.fused_speedup_qwen35_1024[d];
    std::printf("  fused >= %.2fx unfused, %s, 1024 rows/expert, %s: %s  %s\n", kFusedSpeedupTarget,
                kFc1Shapes[0].name, d ? "fp8" : "bf16", number(v, "%.2fx").c_str(),
                verdict(std::isfinite(v), v >= kFusedSpeedupTarget));
  }
  std::printf("  fused never slower than unfused: %d of %d cases slower  %s\n", t.fused_slower,
              t.fused_compared, verdict(t.fused_compared > 0, t.fused_slower == 0));
  for (int d = 0; d < 2; ++d) {
    const double v = t.coop_overhead_max[d];
    std::printf("  cooperative scheduler overhead <= %.0f%% at decode, %s: max %s  %s\n",
                100 * kSchedulerOverheadTarget, d ? "fp8" : "bf16",
                number(100 * v, "%.1f%%").c_str(),
                verdict(std::isfinite(v), v <= kSchedulerOverheadTarget));
  }
  std::printf("  fp8 gated FC1, %s, >= 512 rows/expert: %s TFLOP/s (target %.0f)  %s\n",
              kFc1Shapes[2].name, number(t.deepseek_fp8_tflops, "%.0f").c_str(),
              kDeepSeekFp8TflopsTarget,
              verdict(std::isfinite(t.deepseek_fp8_tflops),
                      t.deepseek_fp8_tflops >= kDeepSeekFp8TflopsTarget));
  std::printf(
      "  decode weight streaming >= %.0f%% of read BW: min %s  %s\n", 100 * kDecodeStreamTarget,
      number(100 * t.decode_stream_min, "%.0f%%").c_str(),
      verdict(std::isfinite(t.decode_stream_min), t.decode_stream_min >= kDecodeStreamTarget));
}

std::string targets_json(const Targets& t) {
  JsonObject j;
  j.num("fused_speedup_qwen35_1024_bf16", t.fused_speedup_qwen35_1024[0])
      .num("fused_speedup_qwen35_1024_fp8", t.fused_speedup_qwen35_1024[1])
      .num("fused_speedup_target", kFusedSpeedupTarget)
      .num("fused_slower_than_unfused_cases", int64_t(t.fused_slower))
      .num("fused_compared_cases", int64_t(t.fused_compared))
      .num("cooperative_overhead_max_bf16", t.coop_overhead_max[0])
      .num("cooperative_overhead_max_fp8", t.coop_overhead_max[1])
      .num("cooperative_overhead_target", kSchedulerOverheadTarget)
      .num("deepseek_fp8_tflops", t.deepseek_fp8_tflops)
      .num("deepseek_fp8_tflops_target", kDeepSeekFp8TflopsTarget)
      .num("decode_stream_fraction_min", t.decode_stream_min)
      .num("decode_stream_fraction_target", kDecodeStreamTarget);
  return j.dump(2);
}

// ---- peak workspace bytes per forward ----------------------------------------------------------

namespace {

// The layer as the Experts parts see it: bf16 hidden states, silu gated in GateUp order (the
// three models' MLP), unquantized or fp8 block-scaled (1x128 activations, 128x128 weights).
MoEConfig layer_config(const Fc1Shape& s, DType dtype) {
  MoEConfig c;
  c.num_experts = s.E;
  c.num_local_experts = s.E;
  c.hidden_size = s.K;
  c.intermediate_size = s.N2 / 2;
  c.topk = kLayerTopk;
  c.in_dtype = DType::bf16;
  c.quant.scheme = dtype == DType::bf16 ? QuantScheme::none : QuantScheme::fp8_block;
  c.activation = Activation::silu;
  c.gated_layout = GatedLayout::GateUp;
  return c;
}

int64_t shape_bytes(const Shape& shape, DType dtype) {
  return shape_numel(shape) * static_cast<int64_t>(dtype_size(dtype));
}

// Builds the part by name through the registry and sizes what ModularKernel::forward would
// allocate for it on M tokens (NoEP, standard format), following src/core/modular_kernel.cpp:
// the workspaces of one chunk, and the fused output in the caller's output (a NoOp-reducing
// part writing (M, K) in the input dtype), in workspace13 (when the part allows it and it fits),
// or in a buffer of its own.
// `reduce_in_gemm2`: Sm90Experts built with the top-k reduce folded into GEMM2 (not a registry
// entry of its own: the same part with a constructor option).
void size_part(WorkspacePart& p, const char* name, const MoEConfig& cfg, int64_t M,
               const Context& ctx, bool reduce_in_gemm2 = false) {
  p.name = reduce_in_gemm2 ? "Sm90Experts(reduce_in_gemm2)" : name;
  const ExpertsEntry* entry = find_experts(name);
  if (entry == nullptr) {
    p.skipped = "not registered";
    return;
  }
  if (std::find(entry->caps.backends.begin(), entry->caps.backends.end(), Backend::cuda) ==
      entry->caps.backends.end()) {
    p.skipped = "no CUDA implementation";
    return;
  }
  if (const Compatibility r = check_config(cfg); !r) {
    p.skipped = r.reason;
    return;
  }
  if (const Compatibility r = check_part(entry->caps, cfg); !r) {
    p.skipped = r.reason;
    return;
  }
  if (entry->caps.hopper_only && !moe_gemm_sm90_available(ctx)) {
    p.skipped = "needs an sm_90 device and the sm_90a kernels";
    return;
  }
  try {
    const std::shared_ptr<Experts> experts =
        reduce_in_gemm2 ? std::make_shared<cuda::Sm90Experts>(cfg, true)
                        : entry->make(cfg, Backend::cuda);
    const int64_t N = cfg.intermediate_size, K = cfg.hidden_size, E = cfg.num_experts,
                  E_local = cfg.num_local_experts, topk = cfg.topk;
    p.chunk =
        (experts->supports_chunking() && ctx.chunk_size > 0) ? std::min(M, ctx.chunk_size) : M;
    const WorkspaceShapes ws = experts->workspace_shapes(p.chunk, N, K, topk, E, E_local, nullptr);
    const WorkspaceShapes full =
        p.chunk == M ? ws : experts->workspace_shapes(M, N, K, topk, E, E_local, nullptr);
    p.ws13_bytes = shape_bytes(ws.workspace13, ws.workspace_dtype);
    p.ws2_bytes = shape_bytes(ws.workspace2, ws.workspace_dtype);
    const int64_t fused_bytes = shape_bytes(full.output, full.output_dtype);
    const bool into_output =
        experts->finalize_weight_and_reduce_impl()->kind() == WeightAndReduceKind::NoOp &&
        experts->activation_formats().first == ActivationFormat::Standard &&
        full.output == Shape{M, K} && full.output_dtype == cfg.in_dtype;
    const bool into_ws13 =
        experts->workspace13_reusable_for_output() && p.chunk == M && fused_bytes <= p.ws13_bytes;
    p.output_bytes = (into_output || into_ws13) ? 0 : fused_bytes;
  } catch (const std::exception& e) {
    p.error = e.what();
  } catch (...) {
    p.error = "unknown exception";
  }
  if (!p.error.empty()) p.ws13_bytes = p.ws2_bytes = p.output_bytes = -1;
}

// Mebibytes with about three significant digits, "-" for a part that has no number.
std::string mib(int64_t bytes) {
  if (bytes < 0) return "-";
  const double v = double(bytes) / double(1 << 20);
  return number(v, v < 10 ? "%.3f" : v < 1000 ? "%.1f" : "%.0f");
}

// "" when the part sized, else its state for the notes column. A long error keeps its end,
// where MODMOE_CUDA_CHECK puts the CUDA error and the place.
std::string part_note(const char* label, const WorkspacePart& p) {
  if (!p.error.empty()) {
    const size_t keep = 100;
    const std::string tail =
        p.error.size() > keep ? "..." + p.error.substr(p.error.size() - keep) : p.error;
    return std::string(label) + ":ERROR " + tail + " ";
  }
  if (!p.skipped.empty()) return std::string(label) + ":skipped (" + p.skipped + ") ";
  if (p.output_bytes > 0) return std::string(label) + ":+out " + mib(p.output_bytes) + " MiB ";
  return "";
}

std::string part_json(const WorkspacePart& p, double unfused_bytes) {
  JsonObject j;
  j.str("experts", p.name);
  if (!p.skipped.empty()) return j.str("skipped", p.skipped).dump(6);
  if (!p.error.empty()) return j.str("error", p.error).dump(6);
  return j.num("chunk_tokens", p.chunk)
      .num("workspace13_bytes", p.ws13_bytes)
      .num("workspace2_bytes", p.ws2_bytes)
      .num("output_buffer_bytes", p.output_bytes)
      .num("total_bytes", p.total_bytes())
      .num("ratio_to_unfused", WorkspaceCase::ratio(p, unfused_bytes))
      .dump(6);
}

}  // namespace

std::vector<WorkspaceCase> run_workspace_study(const Env& env) {
  std::vector<WorkspaceCase> cases;
  for (const Fc1Shape& s : kFc1Shapes) {
    for (DType dtype : {DType::bf16, DType::fp8_e4m3}) {
      const MoEConfig cfg = layer_config(s, dtype);
      const int64_t N = cfg.intermediate_size, K = cfg.hidden_size;
      for (int64_t M : kWorkspaceMs) {
        WorkspaceCase c;
        c.shape = &s;
        c.dtype = dtype;
        c.M = M;
        c.unfused_bytes =
            double(M) * double(kLayerTopk) * double(std::max(2 * N, K) + std::max(N, K)) * 2.0;
        size_part(c.sm90, "Sm90Experts", cfg, M, env.ctx);
        size_part(c.sm90_fold, "Sm90Experts", cfg, M, env.ctx, /*reduce_in_gemm2=*/true);
        size_part(c.portable, "CudaExperts", cfg, M, env.ctx);
        cases.push_back(std::move(c));
      }
    }
  }
  return cases;
}

void print_workspace_table(const std::vector<WorkspaceCase>& cases) {
  bool any_output_buffer = false;
  for (const WorkspaceCase& c : cases)
    any_output_buffer |=
        c.sm90.output_bytes > 0 || c.sm90_fold.output_bytes > 0 || c.portable.output_bytes > 0;
  std::printf(
      "\nPeak workspace per forward (MoE layer, topk %lld, E_local = E; MiB = 2^20 B): "
      "workspace13 + workspace2 from workspace_shapes() at forward's chunk size%s\n",
      static_cast<long long>(kLayerTopk),
      any_output_buffer ? ", + the fused-output buffer where notes say +out"
                        : "; workspaces only: both parts reduce into the caller's (M, K) "
                          "output, so forward allocates no fused-output buffer");
  std::printf(
      "unfused = M*topk*(max(2N,K) + max(N,K)) elements x 2 B, bf16 and fp8 alike (those "
      "buffers hold GEMM outputs, bf16 in an unfused fp8 path too; only GEMM operands are "
      "e4m3); s/unf, f/unf, p/unf = the part's total / unfused (fold = Sm90Experts with the top-k "
      "reduce in GEMM2's epilogue)\n");
  std::printf("%-16s %-4s %5s %11s %9s %9s %9s %6s %9s %6s %9s %9s %9s %6s %s\n", "shape", "dt",
              "M", "unfused_MiB", "sm90_ws13", "sm90_ws2", "sm90_MiB", "s/unf", "fold_MiB", "f/unf",
              "port_ws13", "port_ws2", "port_MiB", "p/unf", "notes");
  for (const WorkspaceCase& c : cases) {
    std::printf("%-16s %-4s %5lld %11s %9s %9s %9s %6s %9s %6s %9s %9s %9s %6s %s%s%s\n",
                c.shape->name,
                dtype_label(c.dtype), static_cast<long long>(c.M),
                mib(static_cast<int64_t>(c.unfused_bytes)).c_str(), mib(c.sm90.ws13_bytes).c_str(),
                mib(c.sm90.ws2_bytes).c_str(), mib(c.sm90.total_bytes()).c_str(),
                number(WorkspaceCase::ratio(c.sm90, c.unfused_bytes), "%.2f").c_str(),
                mib(c.sm90_fold.total_bytes()).c_str(),
                number(WorkspaceCase::ratio(c.sm90_fold, c.unfused_bytes), "%.2f").c_str(),
                mib(c.portable.ws13_bytes).c_str(), mib(c.portable.ws2_bytes).c_str(),
                mib(c.portable.total_bytes()).c_str(),
                number(WorkspaceCase::ratio(c.portable, c.unfused_bytes), "%.2f").c_str(),
                part_note("sm90", c.sm90).c_str(), part_note("fold", c.sm90_fold).c_str(),
                part_note("port", c.portable).c_str());
  }
}

std::string workspace_json(const WorkspaceCase& c) {
  const Fc1Shape& s = *c.shape;
  JsonObject j;
  j.str("shape", s.name)
      .num("E", s.E)
      .num("K", s.K)
      .num("N", s.N2 / 2)
      .num("topk", kLayerTopk)
      .str("dtype", dtype_label(c.dtype))
      .str("scheme", c.dtype == DType::bf16 ? "none" : "fp8-block")
      .num("M", c.M)
      .num("pairs", c.M * kLayerTopk)
      .num("unfused_bytes", c.unfused_bytes)
      .num("unfused_element_bytes", int64_t(2))
      .add("sm90", part_json(c.sm90, c.unfused_bytes))
      .add("sm90_reduce_in_gemm2", part_json(c.sm90_fold, c.unfused_bytes))
      .add("portable", part_json(c.portable, c.unfused_bytes));
  return j.dump(4);
}

}  // namespace modmoe::bench::gemm_bench
