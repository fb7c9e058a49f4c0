// `modmoe-bench --gemm`, the report: the cases as JSON, the FC1 and scheduler tables, and the
// issue's targets evaluated from the measured cases (reported, never failed).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <vector>

#include "bench_json.h"
#include "bench_sm90_cases.h"

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
      "portable = mma.sync gated\n");
  std::printf("%-16s %-4s %5s %7s %-8s %10s %10s %5s %10s %5s %7s %5s %6s %5s %9s %8s %s\n",
              "shape", "dt", "r/exp", "rows", "tile", "fused_us", "unfused_us", "f/u", "portbl_us",
              "p/f", "TFLOP/s", "%peak", "wGB/s", "%BW", "fp8out_us", "max_diff", "notes");
  for (const Fc1Case& c : cases) {
    std::printf("%-16s %-4s %5lld %7lld %-8s ", c.shape->name, dtype_label(c.dtype),
                static_cast<long long>(c.rows_per_expert), static_cast<long long>(c.rows),
                c.tile_fused.c_str());
    if (!c.error.empty()) {
      std::printf("ERROR: %.100s\n", c.error.c_str());
      continue;
    }
    const double peak = env.ceilings.tflops(c.dtype);
    std::printf("%10s %10s %5s %10s %5s %7s %5s %6s %5s %9s %8.1e ", cell(c.fused).c_str(),
                cell(c.unfused).c_str(), number(c.speedup(), "%.2f").c_str(),
                cell(c.portable).c_str(), number(c.vs_portable(), "%.2f").c_str(),
                number(c.tflops(), "%.0f").c_str(), number(100 * c.tflops() / peak, "%.0f").c_str(),
                number(c.weight_gbps(), "%.0f").c_str(),
                number(100 * c.weight_gbps() * 1e9 / env.ceilings.read_bw, "%.0f").c_str(),
                c.dtype == DType::fp8_e4m3 ? cell(c.fp8_out).c_str() : "-",
                worst_diff({&c.fused, &c.unfused, &c.fp8_out}));
    std::string notes =
        problem("fused", c.fused) + problem("unfused", c.unfused) + problem("fp8out", c.fp8_out);
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

}  // namespace modmoe::bench::gemm_bench
