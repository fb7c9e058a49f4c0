#!/usr/bin/env python3
"""Charts of a modmoe-bench results JSON (docs/gpu.md, "JSON (--json FILE)"), of a
modmoe-bench --gemm results JSON (tools/bench_sm90.cu) or of a bench/compare.py results JSON
(docs/gpu.md, "Python comparison") as PNG files.

    python3 bench/plot.py bench/results/2026-11-29-h200-portable.json --out docs/img/
    python3 bench/plot.py bench/results/2026-11-29-h200-compare.json --out docs/img/
    python3 bench/plot.py bench/results/2026-11-29-h200-hopper.json --out docs/img/ \
        --prefix hopper- --compare-with bench/results/2026-11-29-h200-portable.json
    python3 bench/plot.py bench/results/2026-11-29-h200-hopper-gemm.json --out docs/img/ \
        --prefix hopper-

The JSON's "tool" field picks the charts. For modmoe-bench (tool "modmoe-bench") it writes three
charts into --out (names take --prefix in front):

  time-vs-m.png  one panel per model: median forward time against M (log-log), a solid line per
                 quant, that quant's floor (max(bytes / read-BW, flops / peak)) dashed and the
                 cuBLAS per-expert baseline dotted;
  speedup.png    cuBLAS baseline time / modmoe time, per model and M, one panel per quant
                 (above 1: modmoe is faster);
  roofline.png   achieved TFLOP/s against arithmetic intensity (flops / bytes of the case), with
                 the read bandwidth and the bf16 and fp8 GEMM peaks measured in the same run.

With --compare-with OTHER.json (another modmoe-bench run of the same shapes, e.g. the portable
path against the Hopper one) it also writes

  time-vs-m-compare.png  one panel per model: this run's time (solid) and the other run's
                 (dashed, small markers) against M, per quant, with this run's floor dotted.

In the time-vs-M charts a hollow marker on this run's line is a case that ran on other experts
than most of the run (e.g. CudaExperts where the run is mostly Sm90Experts), in speedup.png its
bar is hatched; the legend says which experts.

For modmoe-bench --gemm (tool "modmoe-bench-gemm") it writes two:

  fc1-fused.png  one panel per shape: speedup of the fused gated FC1 (one GEMM with the
                 activation in its epilogue) over the unfused one (plain GEMM + activation_and_mul)
                 = unfused time / fused time against rows per expert, a line per dtype, with 1.0
                 (no gain) and the fused-speedup target;
  scheduler.png  one panel per dtype: overhead over the ideal (a tile list built once, outside the
                 graph) = time / ideal - 1, in %, of the cooperative and linear-scan schedulers
                 (and the precomputed list built inside the graph) against the decode M, with the
                 overhead target.

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
    from matplotlib.patches import Patch
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter
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


TOOLS = ("modmoe-bench", "modmoe-bench-gemm", "modmoe-compare")


def load(path: str) -> dict:
    with open(path) as f:
        results = json.load(f)
    if results.get("tool") not in TOOLS or "cases" not in results:
        sys.exit(f"{path}: not a modmoe-bench, modmoe-bench --gemm or bench/compare.py results "
                 f"JSON (expected tool "
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


def main_experts(cases: list) -> str:
    """The experts class most cases of a run used ("" when the JSON does not say)."""
    counts = OrderedDict()
    for c in cases:
        counts[c.get("experts", "")] = counts.get(c.get("experts", ""), 0) + 1
    return max(counts, key=counts.get) if counts else ""


def mark_other_experts(ax, rows: list, main: str, color: str, marker: str) -> bool:
    """Draws a hollow marker over each case that ran on other experts than `main`: when the
    Hopper experts decline a shape, the run falls back to the portable ones, and a chart that
    hid it would credit the wrong kernel. True when there was such a case."""
    other = [c for c in rows if main and c.get("experts", main) != main]
    if other:
        ax.scatter([c["M"] for c in other], [c["time_us"] for c in other], marker=marker, s=64,
                   facecolors="white", edgecolors=color, linewidths=1.5, zorder=4)  # fmt: skip
    return bool(other)


def other_experts_handle(cases: list, main: str):
    others = ordered(c.get("experts") for c in cases if c.get("experts", main) != main)
    return Line2D([], [], color="gray", marker="o", ls="", markerfacecolor="white",
                  label=f"hollow: ran on {'/'.join(others)} (not {main})")  # fmt: skip


def place_legend(fig, first_ax, handles: list) -> None:
    """The legend goes into the grid's empty panel when there is one (five models on a 3 x 2
    grid), where it hides no data; else into the first panel."""
    spare = [ax for ax in fig.axes if not ax.get_visible()]
    if spare:
        spare[0].set_visible(True)
        spare[0].axis("off")
        spare[0].legend(handles=handles, fontsize=9, loc="center")
    else:
        first_ax.legend(handles=handles, fontsize=8, loc="upper left")


def style_time_axis(ax, model, cases):
    """Title, log axes and labels of one model's time-vs-M panel."""
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


def plot_time_vs_m(results: dict, cases: list, path: str) -> None:
    models = ordered(c["model"] for c in cases)
    quants = ordered(c["quant"] for c in cases)
    main = main_experts(cases)
    any_other = False
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
            any_other |= mark_other_experts(ax, rows, main, color, marker)
            ax.plot(ms, [c["floor_us"] for c in rows], color=color, ls="--", lw=1.3,
                    label=f"floor {quant_label(quant)}")  # fmt: skip
            base = [(c["M"], c["baseline_us"]) for c in rows if c.get("baseline_us")]
            if base:
                ax.plot(*zip(*base), color=color, ls=":", lw=1.3, alpha=0.8,
                        label=f"cuBLAS loop {quant_label(quant)}")  # fmt: skip
        style_time_axis(ax, model, cases)
    handles, _ = axes[0].get_legend_handles_labels()
    if any_other:
        handles.append(other_experts_handle(cases, main))
    place_legend(fig, axes[0], handles)
    settings = results.get("settings", {})
    fig.suptitle(run_title(results, "MoE layer forward time vs M (median of "
                           f"{settings.get('replays', '?')} CUDA-graph replays, "
                           f"L2 flushed: {settings.get('flush_l2', '?')})"))  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_name(path: str) -> str:
    """A short name for a run from its file name: 2026-11-29-h200-portable.json -> h200-portable."""
    stem = os.path.splitext(os.path.basename(path))[0]
    parts = stem.split("-")
    if len(parts) > 3 and all(p.isdigit() for p in parts[:3]):
        stem = "-".join(parts[3:])
    return stem


def plot_time_vs_m_compare(results: dict, cases: list, name: str, other: dict, other_cases: list,
                           other_name: str, path: str) -> None:  # fmt: skip
    """This run against another run of the same shapes: where the two differ, and by how much."""
    models = ordered(c["model"] for c in cases)
    quants = ordered(c["quant"] for c in cases)
    main = main_experts(cases)
    any_other = False
    fig, axes = panel_grid(len(models))
    for ax, model in zip(axes, models):
        for qi, quant in enumerate(quants):
            rows = sorted((c for c in cases if c["model"] == model and c["quant"] == quant),
                          key=lambda c: c["M"])  # fmt: skip
            if not rows:
                continue
            color, marker = quant_style(quant, qi)
            ax.plot([c["M"] for c in rows], [c["time_us"] for c in rows], color=color,
                    marker=marker, lw=2, label=f"{name} {quant_label(quant)}")  # fmt: skip
            any_other |= mark_other_experts(ax, rows, main, color, marker)
            ax.plot([c["M"] for c in rows], [c["floor_us"] for c in rows], color=color, ls=":",
                    lw=1.1, alpha=0.8, label=f"floor {quant_label(quant)}")  # fmt: skip
            theirs = sorted((c for c in other_cases
                             if c["model"] == model and c["quant"] == quant),
                            key=lambda c: c["M"])  # fmt: skip
            if theirs:
                ax.plot([c["M"] for c in theirs], [c["time_us"] for c in theirs], color=color,
                        marker=marker, markersize=3.5, ls="--", lw=1.3, alpha=0.75,
                        label=f"{other_name} {quant_label(quant)}")  # fmt: skip
        style_time_axis(ax, model, cases)
    handles, _ = axes[0].get_legend_handles_labels()
    if any_other:
        handles.append(other_experts_handle(cases, main))
    place_legend(fig, axes[0], handles)
    dates = ordered(str(r.get("date", "?"))[:10] for r in (results, other))
    fig.suptitle(f"MoE layer forward time vs M: {name} (solid) against {other_name} (dashed)\n"
                 f"{results.get('device', {}).get('name', 'unknown GPU')}, {', '.join(dates)}; "
                 "median of CUDA-graph replays, dotted: this run's floor")  # fmt: skip
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
    main = main_experts(cases)
    other_experts = False
    for ax, quant in zip(axes[0], quants):
        for mi, model in enumerate(models):
            xs, ys, others = [], [], []
            for xi, m in enumerate(ms):
                case = next((c for c in with_base
                             if c["model"] == model and c["quant"] == quant and c["M"] == m), None)
                if case is not None:
                    xs.append(xi - 0.4 + width * (mi + 0.5))
                    ys.append(case["speedup_vs_baseline"])
                    others.append(bool(main) and case.get("experts", main) != main)
            # Bars grow from 1 (no speedup) up or down, so slower cases point downwards.
            ax.bar(xs, [y - 1 for y in ys], bottom=1, width=width * 0.92,
                   color=cmap(mi / max(len(models) - 1, 1)), label=model)  # fmt: skip
            if any(others):
                # Hatched: the case fell back to other experts (see mark_other_experts).
                ax.bar([x for x, o in zip(xs, others) if o],
                       [y - 1 for y, o in zip(ys, others) if o], bottom=1, width=width * 0.92,
                       fill=False, hatch="////", edgecolor="white", lw=0)  # fmt: skip
                other_experts = True
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
    handles, _ = axes[0][0].get_legend_handles_labels()
    if other_experts:
        others = ordered(c.get("experts") for c in with_base if c.get("experts", main) != main)
        handles.append(Patch(facecolor="gray", hatch="////", edgecolor="white",
                             label=f"hatched: ran on {'/'.join(others)} (not {main})"))
    # Under the panels: inside one, the legend hid the tallest bars.
    fig.legend(handles=handles, fontsize=8.5, loc="lower center", ncol=len(handles),
               frameon=False)  # fmt: skip
    fig.suptitle(run_title(results, "Speedup of modmoe over a per-expert cuBLAS loop "
                           "(both captured in CUDA graphs)"))  # fmt: skip
    fig.tight_layout(rect=(0, 0.06, 1, 1))
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


# ---- modmoe-bench --gemm results (tool "modmoe-bench-gemm", tools/bench_sm90.cu) ---------------

GEMM_DTYPE_STYLE = {"bf16": ("tab:blue", "o"), "fp8": ("tab:red", "^")}


def gemm_dtype_style(dtype: str, index: int):
    if dtype in GEMM_DTYPE_STYLE:
        return GEMM_DTYPE_STYLE[dtype]
    return (FALLBACK_COLORS[index % len(FALLBACK_COLORS)],
            FALLBACK_MARKERS[index % len(FALLBACK_MARKERS)])  # fmt: skip


def variant_us(case: dict, variant: str):
    """The variant's median time in µs, or None when it did not run, was declined ("n/a"), failed
    or gave a wrong output: a wrong kernel's time would flatter it."""
    entry = case.get(variant)
    if not isinstance(entry, dict) or "error" in entry or entry.get("correct") is False:
        return None
    value = entry.get("time_us")
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return None
    return float(value)


def gemm_cases(results: dict, kind: str, variants: tuple) -> list:
    """The run's cases of `kind` ("fc1" or "scheduler") in which every named variant timed."""
    of_kind = [c for c in results["cases"] if c.get("kind") == kind]
    good = [c for c in of_kind
            if "error" not in c and all(variant_us(c, v) is not None for v in variants)]
    if len(good) < len(of_kind):
        print(f"plot.py: {len(of_kind) - len(good)} {kind} case(s) carry an error or lack a timing "
              f"of {', '.join(variants)}; left out", file=sys.stderr)  # fmt: skip
    return good


def gemm_title(results: dict, what: str) -> str:
    device = results.get("device", {}).get("name", "unknown GPU")
    date = str(results.get("date", "unknown date"))[:10]
    settings = results.get("settings", {})
    return (f"{what}\n{device}, {date}; median of {settings.get('replays', '?')} CUDA-graph "
            f"replays, L2 {'flushed' if settings.get('flush_l2') else 'warm'}")


def plot_fc1_fused(results: dict, cases: list, path: str) -> None:
    shapes = ordered(c["shape"] for c in cases)
    dtypes = ordered(c["dtype"] for c in cases)
    targets = results.get("targets", {})
    target = targets.get("fused_speedup_target")
    speedups = [variant_us(c, "unfused") / variant_us(c, "fused") for c in cases]
    low = min(min(speedups), 1.0) - 0.1
    high = max(max(speedups), target or 1.0) + 0.12
    # The measured row counts (1, 64, 128, ...) sit evenly spaced: on a log axis the decode point
    # would stand far off and the others crowd together.
    all_rows = sorted(set(c["rows_per_expert"] for c in cases))
    position = {r: i for i, r in enumerate(all_rows)}
    speedup = {(c["shape"], c["dtype"], c["rows_per_expert"]):
               variant_us(c, "unfused") / variant_us(c, "fused") for c in cases}  # fmt: skip
    fig, axes = panel_grid(len(shapes))
    for ax, shape in zip(axes, shapes):
        for di, dtype in enumerate(dtypes):
            rows = sorted((c for c in cases if c["shape"] == shape and c["dtype"] == dtype),
                          key=lambda c: c["rows_per_expert"])  # fmt: skip
            if not rows:
                continue
            color, marker = gemm_dtype_style(dtype, di)
            xs = [position[c["rows_per_expert"]] for c in rows]
            ys = [speedup[(shape, dtype, c["rows_per_expert"])] for c in rows]
            ax.plot(xs, ys, color=color, marker=marker, lw=2, label=f"{dtype} fused / unfused")
            for c, x, y in zip(rows, xs, ys):
                # The highest series at this point is labelled above, the others below, so the
                # labels of two close points do not overlap.
                here = [v for (sh, _, r), v in speedup.items()
                        if sh == shape and r == c["rows_per_expert"]]  # fmt: skip
                above = y >= max(here)
                # The tile the heuristic chose explains the steps along the line.
                ax.annotate(f"{y:.2f}\n{c.get('tile_fused', '')}", (x, y), ha="center",
                            fontsize=6.5, color=color, va="bottom" if above else "top",
                            xytext=(0, 4 if above else -5), textcoords="offset points")
        ax.axhline(1.0, color="black", lw=1)
        if target:
            ax.axhline(target, color="gray", ls="--", lw=1,
                       label=f"target {target:g}x (qwen3.5-35b-a3b, 1024 rows/expert)")
        first = next(c for c in cases if c["shape"] == shape)
        ax.set_title(f"{shape} FC1  (E={first['E']}, K={first['K']}, 2N={first['N2']})",
                     fontsize=10)  # fmt: skip
        ax.set_xticks(range(len(all_rows)))
        ax.set_xticklabels([f"{r}\n(decode)" if r == 1 else str(r) for r in all_rows])
        ax.set_xlim(-0.4, len(all_rows) - 0.6)
        ax.set_ylim(low, high)
        ax.set_xlabel("rows per expert (the same count for every expert)")
        ax.grid(True, which="major", alpha=0.35)
    axes[0].set_ylabel("speedup = unfused time / fused time")
    axes[0].legend(fontsize=7.5, loc="lower right")
    fig.suptitle(gemm_title(results, "Hopper FC1 (gated, bf16 out): fused activation epilogue vs "
                            "GEMM + activation_and_mul (above 1: fused faster)"))  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# (variant, legend label, line style, line width); the ideal is the reference, so not drawn.
SCHEDULER_SERIES = (
    ("cooperative", "cooperative (in-kernel, shared tile count)", "-", 2.0),
    ("linear_scan", "linear scan (each CTA walks the experts)", "--", 2.0),
    ("precomputed_with_build", "precomputed list built in the graph (2 nodes)", ":", 1.4),
)


def plot_scheduler(results: dict, cases: list, path: str) -> None:
    dtypes = ordered(c["dtype"] for c in cases)
    target = results.get("targets", {}).get("cooperative_overhead_target")
    fig, axes = plt.subplots(1, len(dtypes), figsize=(7.2 * len(dtypes), 6.0), squeeze=False,
                             sharey=True)  # fmt: skip
    overheads = [100 * (variant_us(c, v) / variant_us(c, "ideal") - 1)
                 for c in cases for v, *_ in SCHEDULER_SERIES if variant_us(c, v) is not None]
    for ax, dtype in zip(axes[0], dtypes):
        rows = sorted((c for c in cases if c["dtype"] == dtype), key=lambda c: c["M"])
        color, _ = gemm_dtype_style(dtype, dtypes.index(dtype))
        for si, (variant, label, style, width) in enumerate(SCHEDULER_SERIES):
            timed = [c for c in rows if variant_us(c, variant) is not None]
            if len(timed) < len(rows):
                print(f"plot.py: scheduler {dtype}: {variant} has no good timing at M = "
                      f"{', '.join(str(c['M']) for c in rows if c not in timed)}; left out",
                      file=sys.stderr)  # fmt: skip
            if not timed:
                continue
            ms = [c["M"] for c in timed]
            ys = [100 * (variant_us(c, variant) / variant_us(c, "ideal") - 1) for c in timed]
            series_color = ("black", color, "gray")[si % 3]
            ax.plot(ms, ys, color=series_color, ls=style, lw=width,
                    marker=("o", "s", ".")[si % 3], label=label)
            if variant != "precomputed_with_build":
                for c, m, y in zip(timed, ms, ys):
                    # Cooperative above the linear scan when it is the slower one, else below,
                    # so the two labels of one M do not overlap.
                    mate = "linear_scan" if variant == "cooperative" else "cooperative"
                    mate_us = variant_us(c, mate)
                    above = mate_us is None or variant_us(c, variant) >= mate_us
                    ax.annotate(f"{y:.1f}", (m, y), fontsize=6.5, color=series_color,
                                ha="center", va="bottom" if above else "top",
                                xytext=(0, 3 if above else -4), textcoords="offset points",
                                bbox=dict(boxstyle="square,pad=0.1", fc="white", ec="none",
                                          alpha=0.75))  # fmt: skip
        if target is not None:
            ax.axhline(100 * target, color="tab:green", lw=1.3, ls="-.",
                       label=f"target: cooperative <= {100 * target:g}%")
        ax.axhline(0, color="black", lw=0.8)
        # Linear up to 20 %, where the target sits, logarithmic above, so the linear scan's
        # 100+ % at M = 1 fits without flattening the few-% differences that matter.
        ax.set_yscale("symlog", linthresh=20, linscale=1.6)
        ax.set_ylim(min(min(overheads), 0) - 5, max(overheads) * 1.6)
        ax.yaxis.set_major_locator(FixedLocator([-5, 0, 5, 10, 15, 20, 50, 100, 200]))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:g}%"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xscale("log", base=2)
        ax.set_xticks([c["M"] for c in rows])
        ax.set_xticklabels([f"{c['M']}\n{c['rows']} rows\n{c['experts_hit']} exp."
                            for c in rows], fontsize=7.5)  # fmt: skip
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("M (tokens; rows = M x topk, experts hit)")
        first = rows[0]
        ax.set_title(f"{dtype}: FC1 E={first['E']}, topk={first['topk']}, K={first['K']}, "
                     f"2N={first['N2']}", fontsize=10)  # fmt: skip
        ax.grid(True, which="major", alpha=0.35)
    axes[0][0].set_ylabel("overhead over the ideal = time / ideal - 1")
    axes[0][0].legend(fontsize=7.5, loc="upper right")
    fig.suptitle(gemm_title(results, "Hopper grouped-GEMM schedulers at decode (qwen3.5-35b-a3b "
                            "FC1): overhead over a tile list built once outside the graph"))
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
        "floor, speedup over the cuBLAS baseline, roofline), a modmoe-bench --gemm results JSON "
        "into charts of the fused FC1 and of the schedulers, or a bench/compare.py results JSON "
        "into a chart of modmoe's speedup over the PyTorch baselines. Needs matplotlib.")
    parser.add_argument("results", help="modmoe-bench --json, modmoe-bench --gemm --json or "
                        "bench/compare.py output, e.g. "
                        "bench/results/2026-11-29-h200-portable.json, "
                        "2026-11-29-h200-hopper-gemm.json or "
                        "2026-11-29-h200-compare.json")  # fmt: skip
    parser.add_argument("--out", default="docs/img", help="folder for the PNGs (default "
                        "docs/img; created when missing)")  # fmt: skip
    parser.add_argument("--prefix", default="", help="put this in front of each file name")
    parser.add_argument("--compare-with", metavar="FILE", help="modmoe-bench only: another "
                        "modmoe-bench JSON of the same shapes; adds time-vs-m-compare.png with "
                        "both runs' times")  # fmt: skip
    args = parser.parse_args(argv)

    results = load(args.results)
    if args.compare_with and results["tool"] != "modmoe-bench":
        parser.error(f"--compare-with works with a modmoe-bench JSON; {args.results} is "
                     f"{results['tool']!r}")  # fmt: skip
    other = load(args.compare_with) if args.compare_with else None
    if other is not None and other["tool"] != "modmoe-bench":
        parser.error(f"--compare-with needs a modmoe-bench JSON; {args.compare_with} is "
                     f"{other['tool']!r}")  # fmt: skip
    os.makedirs(args.out, exist_ok=True)
    written = []

    def out(name: str) -> str:
        return os.path.join(args.out, f"{args.prefix}{name}")

    if results["tool"] == "modmoe-compare":
        plot_compare_speedup(results, compare_cases(results), out("compare-speedup.png"))
        written.append(out("compare-speedup.png"))
    elif results["tool"] == "modmoe-bench-gemm":
        fc1 = gemm_cases(results, "fc1", ("fused", "unfused"))
        if fc1:
            plot_fc1_fused(results, fc1, out("fc1-fused.png"))
            written.append(out("fc1-fused.png"))
        scheduler = gemm_cases(results, "scheduler", ("ideal",))
        if scheduler:
            plot_scheduler(results, scheduler, out("scheduler.png"))
            written.append(out("scheduler.png"))
        if not written:
            sys.exit("plot.py: no fc1 or scheduler case with timings in the results")
    else:
        cases = good_cases(results)
        plot_time_vs_m(results, cases, out("time-vs-m.png"))
        written.append(out("time-vs-m.png"))
        if plot_speedup(results, cases, out("speedup.png")):
            written.append(out("speedup.png"))
        plot_roofline(results, cases, out("roofline.png"))
        written.append(out("roofline.png"))
        if other is not None:
            plot_time_vs_m_compare(results, cases, run_name(args.results), other,
                                   good_cases(other), run_name(args.compare_with),
                                   out("time-vs-m-compare.png"))  # fmt: skip
            written.append(out("time-vs-m-compare.png"))
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
