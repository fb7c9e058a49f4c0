#!/usr/bin/env python3
"""Charts of a modmoe-bench results JSON (docs/gpu.md, "JSON (--json FILE)") or of a
bench/compare.py results JSON (docs/gpu.md, "Python comparison") as PNG files.

    python3 bench/plot.py bench/results/2026-11-29-h200-portable.json --out docs/img/
    python3 bench/plot.py bench/results/2026-11-29-h200-compare.json --out docs/img/

The JSON's "tool" field picks the charts. For modmoe-bench (tool "modmoe-bench") it writes three
charts into --out (names take --prefix in front):

  time-vs-m.png  one panel per model: median forward time against M (log-log), a solid line per
                 quant, that quant's floor (max(bytes / read-BW, flops / peak)) dashed and the
                 cuBLAS per-expert baseline dotted;
  speedup.png    cuBLAS baseline time / modmoe time, per model and M, one panel per quant
                 (above 1: modmoe is faster);
  roofline.png   achieved TFLOP/s against arithmetic intensity (flops / bytes of the case), with
                 the read bandwidth and the bf16 and fp8 GEMM peaks measured in the same run.

For bench/compare.py (tool "modmoe-compare") it writes one:

  compare-speedup.png  one panel per model: speedup = baseline time / modmoe time against M, a
                 bar per (quant, torch baseline) that ran, growing up from 1.0 when modmoe is
                 faster and down when it is slower; a baseline skipped in every case of the
                 run is named under the chart with its reason.

Needs: Python 3.8+ and matplotlib (pip install matplotlib); nothing else (no torch, no modmoe).
Cases that carry "error" (no timings) are left out, and said so.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections import OrderedDict

try:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
except ImportError:
    sys.exit("bench/plot.py needs matplotlib: pip install matplotlib")

QUANT_LABEL = {"none": "bf16"}
QUANT_STYLE = {"none": ("tab:blue", "o"), "fp8-block": ("tab:red", "^")}
FALLBACK_COLORS = ["tab:green", "tab:purple", "tab:brown", "tab:olive"]
FALLBACK_MARKERS = ["s", "D", "v", "P"]


def quant_label(quant: str) -> str:
    return QUANT_LABEL.get(quant, quant)


def quant_style(quant: str, index: int):
    if quant in QUANT_STYLE:
        return QUANT_STYLE[quant]
    return (FALLBACK_COLORS[index % len(FALLBACK_COLORS)],
            FALLBACK_MARKERS[index % len(FALLBACK_MARKERS)])  # fmt: skip


def plain_number(value: float, _pos=None) -> str:
    """Tick labels such as 1, 16, 128, 0.5 instead of 10^x (M values and speedups read better)."""
    if value >= 1:
        return f"{value:g}"
    return f"{value:.2g}"


TOOLS = ("modmoe-bench", "modmoe-compare")


def load(path: str) -> dict:
    with open(path) as f:
        results = json.load(f)
    if results.get("tool") not in TOOLS or "cases" not in results:
        sys.exit(f"{path}: not a modmoe-bench or bench/compare.py results JSON (expected tool "
                 f"{' or '.join(repr(t) for t in TOOLS)} and 'cases'; got tool "
                 f"{results.get('tool')!r})")  # fmt: skip
    return results


def good_cases(results: dict) -> list:
    cases = [c for c in results["cases"] if "error" not in c and "time_us" in c]
    failed = len(results["cases"]) - len(cases)
    if failed:
        print(f"plot.py: {failed} case(s) carry an error and no timings; left out", file=sys.stderr)
    if not cases:
        sys.exit("plot.py: no case with timings in the results")
    return cases


def ordered(values) -> list:
    """Unique values in first-seen order (the benchmark's own model / quant order)."""
    return list(OrderedDict.fromkeys(values))


def run_title(results: dict, what: str) -> str:
    device = results.get("device", {}).get("name", "unknown GPU")
    date = str(results.get("date", "unknown date"))[:10]
    settings = results.get("settings", {})
    pf = settings.get("prepare_finalize", "")
    experts = ordered(c.get("experts", "") for c in results["cases"] if c.get("experts"))
    parts = f"{pf} + {'/'.join(experts)}" if pf and experts else ""
    line2 = f"{device}, {date}" + (f" — {parts}" if parts else "")
    return f"{what}\n{line2}"


def panel_grid(count: int):
    cols = min(count, 3)
    rows = math.ceil(count / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.2 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[count:]:
        ax.set_visible(False)
    return fig, flat[:count]


def plot_time_vs_m(results: dict, cases: list, path: str) -> None:
    models = ordered(c["model"] for c in cases)
    quants = ordered(c["quant"] for c in cases)
    fig, axes = panel_grid(len(models))
    for ax, model in zip(axes, models):
        for qi, quant in enumerate(quants):
            rows = sorted((c for c in cases if c["model"] == model and c["quant"] == quant),
                          key=lambda c: c["M"])  # fmt: skip
            if not rows:
                continue
            color, marker = quant_style(quant, qi)
            ms = [c["M"] for c in rows]
            ax.plot(ms, [c["time_us"] for c in rows], color=color, marker=marker, lw=2,
                    label=f"modmoe {quant_label(quant)}")  # fmt: skip
            ax.plot(ms, [c["floor_us"] for c in rows], color=color, ls="--", lw=1.3,
                    label=f"floor {quant_label(quant)}")  # fmt: skip
            base = [(c["M"], c["baseline_us"]) for c in rows if c.get("baseline_us")]
            if base:
                ax.plot(*zip(*base), color=color, ls=":", lw=1.3, alpha=0.8,
                        label=f"cuBLAS loop {quant_label(quant)}")  # fmt: skip
        first = next(c for c in cases if c["model"] == model)
        ax.set_title(f"{model}  (E={first['E']}, topk={first['topk']}, "
                     f"K={first['K']}, N={first['N']})", fontsize=10)  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(plain_number))
        ax.yaxis.set_major_formatter(FuncFormatter(plain_number))
        ax.set_xlabel("M (tokens)")
        ax.set_ylabel("time per forward (µs)")
        ax.grid(True, which="major", alpha=0.35)
        ax.grid(True, which="minor", alpha=0.12)
    axes[0].legend(fontsize=8, loc="upper left")
    settings = results.get("settings", {})
    fig.suptitle(run_title(results, "MoE layer forward time vs M (median of "
                           f"{settings.get('replays', '?')} CUDA-graph replays, "
                           f"L2 flushed: {settings.get('flush_l2', '?')})"))  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_speedup(results: dict, cases: list, path: str) -> bool:
    with_base = [c for c in cases if c.get("speedup_vs_baseline")]
    if not with_base:
        print("plot.py: no case has a baseline (--no-baseline run?): no speedup chart",
              file=sys.stderr)  # fmt: skip
        return False
    models = ordered(c["model"] for c in cases)
    quants = ordered(c["quant"] for c in with_base)
    ms = sorted(set(c["M"] for c in with_base))
    fig, axes = plt.subplots(1, len(quants), figsize=(7.5 * len(quants), 4.8), squeeze=False,
                             sharey=True)  # fmt: skip
    cmap = plt.get_cmap("viridis")
    width = 0.8 / len(models)
    speedups = [c["speedup_vs_baseline"] for c in with_base]
    low, high = min(min(speedups), 0.9), max(max(speedups), 1.1)
    for ax, quant in zip(axes[0], quants):
        for mi, model in enumerate(models):
            xs, ys = [], []
            for xi, m in enumerate(ms):
                case = next((c for c in with_base
                             if c["model"] == model and c["quant"] == quant and c["M"] == m), None)
                if case is not None:
                    xs.append(xi - 0.4 + width * (mi + 0.5))
                    ys.append(case["speedup_vs_baseline"])
            # Bars grow from 1 (no speedup) up or down, so slower cases point downwards.
            ax.bar(xs, [y - 1 for y in ys], bottom=1, width=width * 0.92,
                   color=cmap(mi / max(len(models) - 1, 1)), label=model)  # fmt: skip
            for x, y in zip(xs, ys):
                ax.annotate(f"{y:.2g}", (x, y), ha="center", fontsize=6.5,
                            va="bottom" if y >= 1 else "top",
                            xytext=(0, 1.5 if y >= 1 else -1.5), textcoords="offset points")
        ax.axhline(1.0, color="black", lw=1)
        ax.set_yscale("log")
        ax.set_ylim(low / 1.4, high * 1.4)
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(plain_number))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xticks(range(len(ms)))
        ax.set_xticklabels([str(m) for m in ms])
        ax.set_xlabel("M (tokens)")
        ax.set_title(f"{quant_label(quant)}: baseline = "
                     f"{'cublasGemmEx bf16' if quant == 'none' else 'cuBLASLt block-scaled fp8'}"
                     " per expert", fontsize=10)  # fmt: skip
        ax.grid(True, axis="y", which="major", alpha=0.35)
    axes[0][0].set_ylabel("speedup = cuBLAS loop time / modmoe time")
    axes[0][0].legend(fontsize=8, loc="upper right")
    fig.suptitle(run_title(results, "Speedup of modmoe over a per-expert cuBLAS loop "
                           "(both captured in CUDA graphs)"))  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_roofline(results: dict, cases: list, path: str) -> None:
    bandwidth = float(results["read_bw_GBps"]) * 1e9  # bytes / s
    peaks = results.get("peaks", {})
    bf16_peak = float(peaks.get("bf16_tflops") or 0)
    fp8_peak = float(peaks.get("fp8_tflops_used") or 0)
    models = ordered(c["model"] for c in cases)
    quants = ordered(c["quant"] for c in cases)
    cmap = plt.get_cmap("viridis")
    fig, ax = plt.subplots(figsize=(10, 6.5))

    intensities = [c["flops"] / c["bytes"] for c in cases]
    x_lo, x_hi = min(intensities) / 2, max(intensities) * 3
    grid = [x_lo * (x_hi / x_lo) ** (i / 200) for i in range(201)]
    ceilings = [(bf16_peak, "bf16", "black", "-")]
    if fp8_peak > 0:
        ceilings.append((fp8_peak, "fp8", "dimgray", "-."))
    for peak, name, color, style in ceilings:
        if peak <= 0:
            continue
        ax.plot(grid, [min(peak, x * bandwidth / 1e12) for x in grid], color=color, ls=style,
                lw=1.6)  # fmt: skip
        ridge = peak * 1e12 / bandwidth
        ax.annotate(f"{name} GEMM peak {peak:.0f} TFLOP/s (ridge {ridge:.0f} FLOP/B)",
                    (x_hi, peak), ha="right", va="bottom", fontsize=8, color=color,
                    xytext=(0, 2), textcoords="offset points")  # fmt: skip
    # The bandwidth roof's label ends just above its slope, well left of the bf16 ridge point.
    x_label = min(x_lo * 16, bf16_peak * 1e12 / bandwidth / 4) if bf16_peak else x_lo * 16
    ax.annotate(f"read bandwidth {bandwidth / 1e9:.0f} GB/s", (x_label, x_label * bandwidth / 1e12),
                fontsize=8, ha="right", va="bottom", xytext=(-6, 4),
                textcoords="offset points")  # fmt: skip

    for mi, model in enumerate(models):
        color = cmap(mi / max(len(models) - 1, 1))
        for qi, quant in enumerate(quants):
            rows = sorted((c for c in cases if c["model"] == model and c["quant"] == quant),
                          key=lambda c: c["M"])  # fmt: skip
            if not rows:
                continue
            _, marker = quant_style(quant, qi)
            xs = [c["flops"] / c["bytes"] for c in rows]
            ys = [c["tflops"] for c in rows]
            ax.plot(xs, ys, color=color, lw=0.8, alpha=0.5)
            ax.scatter(xs, ys, color=color, marker=marker, s=38, zorder=3,
                       edgecolors="black" if quant != "none" else "none", linewidths=0.5)
            # M labels on one series only (the others run the same Ms, left to right): more
            # would pile up where the series meet.
            if model == models[0] and qi == 0:
                for c, x, y in zip(rows, xs, ys):
                    ax.annotate(f"M={c['M']}", (x, y), fontsize=7, xytext=(4, -10),
                                textcoords="offset points", color="dimgray")  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(x_lo, x_hi)
    ax.xaxis.set_major_formatter(FuncFormatter(plain_number))
    ax.yaxis.set_major_formatter(FuncFormatter(plain_number))
    ax.set_xlabel("arithmetic intensity = flops / bytes moved (FLOP/byte; bytes = weights of "
                  "the experts hit + scales + activations)")  # fmt: skip
    ax.set_ylabel("achieved TFLOP/s (modmoe forward)")
    ax.grid(True, which="major", alpha=0.35)
    ax.grid(True, which="minor", alpha=0.1)
    handles = [Line2D([], [], color=cmap(i / max(len(models) - 1, 1)), marker="o", ls="",
                      label=m) for i, m in enumerate(models)]  # fmt: skip
    handles += [Line2D([], [], color="gray", marker=quant_style(q, i)[1], ls="",
                       markeredgecolor="black" if q != "none" else "gray",
                       label=quant_label(q)) for i, q in enumerate(quants)]  # fmt: skip
    ax.legend(handles=handles, fontsize=8, loc="upper left",
              title=f"one point per M ({', '.join(str(m) for m in sorted(set(c['M'] for c in cases)))})",
              title_fontsize=8)  # fmt: skip
    fig.suptitle(run_title(results, "Roofline: modmoe forward against the measured ceilings"))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- bench/compare.py results (tool "modmoe-compare") ---------------------------------------------

# (quant, baseline) -> (legend label, color). Unknown pairs fall back to FALLBACK_COLORS.
COMPARE_SERIES = {
    ("bf16", "grouped_mm"): ("bf16: torch._grouped_mm pipeline", "tab:blue"),
    ("bf16", "torch_loop"): ("bf16: per-expert torch.mm loop", "lightskyblue"),
    ("fp8-token", "scaled_grouped_mm"): ("fp8 rowwise: torch._scaled_grouped_mm pipeline",
                                         "tab:red"),
    ("fp8-token", "torch_loop"): ("fp8 rowwise: per-expert torch._scaled_mm loop", "lightsalmon"),
}


def compare_series_style(quant: str, baseline: str, index: int):
    if (quant, baseline) in COMPARE_SERIES:
        return COMPARE_SERIES[(quant, baseline)]
    return (f"{quant}: {baseline}", FALLBACK_COLORS[index % len(FALLBACK_COLORS)])


def compare_cases(results: dict) -> list:
    """Cases where modmoe itself was timed (compare.py records a failed case with "error")."""
    cases = [c for c in results["cases"] if "error" not in c and "time_us" in c.get("modmoe", {})]
    failed = len(results["cases"]) - len(cases)
    if failed:
        print(f"plot.py: {failed} case(s) carry an error and no modmoe timing; left out",
              file=sys.stderr)  # fmt: skip
    if not cases:
        sys.exit("plot.py: no case with a modmoe timing in the results")
    return cases


def compare_speedup(case: dict, baseline: str):
    """baseline time / modmoe time, or None when that baseline did not run in this case."""
    entry = case.get("baselines", {}).get(baseline, {})
    if "time_us" not in entry:
        return None
    return entry.get("speedup") or entry["time_us"] / case["modmoe"]["time_us"]


def plot_compare_speedup(results: dict, cases: list, path: str) -> None:
    models = ordered(c["model"] for c in cases)
    ms = sorted(set(c["M"] for c in cases))
    # Every (quant, baseline) pair in the run's order; the ones that never ran anywhere get no
    # bar (an empty slot would read as "speedup 1") and are named under the chart instead.
    pairs = ordered((c["quant"], b) for c in cases for b in c.get("baselines", {}))
    timed = [p for p in pairs if any(compare_speedup(c, p[1]) is not None
                                     for c in cases if c["quant"] == p[0])]  # fmt: skip
    never = [p for p in pairs if p not in timed]
    if not timed:
        sys.exit("plot.py: no baseline was timed in any case: nothing to chart")

    speedups = [compare_speedup(c, b) for c in cases for q, b in timed if c["quant"] == q]
    speedups = [s for s in speedups if s is not None]
    low, high = min(min(speedups), 0.9), max(max(speedups), 1.1)
    fig, axes = panel_grid(len(models))
    width = 0.8 / len(timed)
    for ax, model in zip(axes, models):
        for si, (quant, baseline) in enumerate(timed):
            label, color = compare_series_style(quant, baseline, si)
            xs, ys = [], []
            for xi, m in enumerate(ms):
                case = next((c for c in cases
                             if c["model"] == model and c["quant"] == quant and c["M"] == m), None)
                value = compare_speedup(case, baseline) if case is not None else None
                if value is not None:
                    xs.append(xi - 0.4 + width * (si + 0.5))
                    ys.append(value)
            # Bars grow from 1 (as fast as modmoe) up or down, so cases modmoe loses point down.
            ax.bar(xs, [y - 1 for y in ys], bottom=1, width=width * 0.92, color=color,
                   label=label)  # fmt: skip
            for x, y in zip(xs, ys):
                ax.annotate(f"{y:.2g}", (x, y), ha="center", fontsize=6.5,
                            va="bottom" if y >= 1 else "top",
                            xytext=(0, 1.5 if y >= 1 else -1.5), textcoords="offset points")
        first = next(c for c in cases if c["model"] == model)
        ax.set_title(f"{model}  (E={first['E']}, topk={first['topk']}, "
                     f"K={first['K']}, N={first['N']})", fontsize=10)  # fmt: skip
        ax.axhline(1.0, color="black", lw=1)
        ax.set_yscale("log")
        ax.set_ylim(low / 1.4, high * 1.4)
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(plain_number))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xticks(range(len(ms)))
        ax.set_xticklabels([str(m) for m in ms])
        ax.set_xlabel("M (tokens)")
        ax.grid(True, axis="y", which="major", alpha=0.35)
    axes[0].set_ylabel("speedup = torch time / modmoe time")
    axes[0].legend(fontsize=7.5, loc="upper right")
    settings = results.get("settings", {})
    device = results.get("device", {})
    torch_version = device.get("torch")
    fig.suptitle(run_title(results, "Speedup of modmoe.fused_moe over PyTorch MoE pipelines "
                           f"(above 1: modmoe faster; median of {settings.get('replays', '?')} "
                           f"CUDA-graph replays, L2 {'flushed' if settings.get('flush_l2') else 'warm'}"
                           + (f", torch {torch_version}" if torch_version else "") + ")"))
    notes = []
    for quant, baseline in never:
        # Reasons differ by the failing call's shapes; the part before them is the reason.
        reasons = ordered(str(c["baselines"][baseline].get("skipped", "no timing"))
                          .split(" when calling")[0][:110]
                          for c in cases
                          if c["quant"] == quant and baseline in c.get("baselines", {}))
        reason = reasons[0] if reasons else "no timing"
        more = f" (and {len(reasons) - 1} other reason(s))" if len(reasons) > 1 else ""
        notes.append(f"not shown: {compare_series_style(quant, baseline, 0)[0]} skipped in every "
                     f"case: {reason}{more}")  # fmt: skip
    if notes:
        fig.text(0.5, 0.01, "\n".join(notes), ha="center", va="bottom", fontsize=8,
                 color="dimgray")  # fmt: skip
        fig.tight_layout(rect=(0, 0.03 * len(notes) + 0.01, 1, 1))
    else:
        fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description="Turn a modmoe-bench results JSON into PNG charts (time vs M with the "
        "floor, speedup over the cuBLAS baseline, roofline), or a bench/compare.py results JSON "
        "into a chart of modmoe's speedup over the PyTorch baselines. Needs matplotlib.")
    parser.add_argument("results", help="modmoe-bench --json or bench/compare.py output, e.g. "
                        "bench/results/2026-11-29-h200-portable.json or "
                        "bench/results/2026-11-29-h200-compare.json")  # fmt: skip
    parser.add_argument("--out", default="docs/img", help="folder for the PNGs (default "
                        "docs/img; created when missing)")  # fmt: skip
    parser.add_argument("--prefix", default="", help="put this in front of each file name")
    args = parser.parse_args(argv)

    results = load(args.results)
    os.makedirs(args.out, exist_ok=True)
    if results["tool"] == "modmoe-compare":
        path = os.path.join(args.out, f"{args.prefix}compare-speedup.png")
        plot_compare_speedup(results, compare_cases(results), path)
        print(path)
        return 0
    cases = good_cases(results)
    written = []
    path = os.path.join(args.out, f"{args.prefix}time-vs-m.png")
    plot_time_vs_m(results, cases, path)
    written.append(path)
    path = os.path.join(args.out, f"{args.prefix}speedup.png")
    if plot_speedup(results, cases, path):
        written.append(path)
    path = os.path.join(args.out, f"{args.prefix}roofline.png")
    plot_roofline(results, cases, path)
    written.append(path)
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
