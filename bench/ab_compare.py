#!/usr/bin/env python3
"""Compare two modmoe-bench results of the same kind, case by case (an A/B of two builds).

    python3 bench/ab_compare.py BASE.json CANDIDATE.json [--markdown]

Both files come from `modmoe-bench --json` (the whole layer: one case per model x quant x M) or
`modmoe-bench --gemm --json` (FC1 cases: fused / unfused / portable times; scheduler cases:
ideal / cooperative / linear scan). Cases are matched by their keys, not by position; a case in
only one file is listed as such. cand/base < 1: the candidate is faster. The two runs should be
one machine's, in one call (scripts/gpu-ab): across runs the same binary moved by up to 10 %.
"""
import argparse
import json
import signal
import statistics
import sys


def case_order(key):
    """Names alphabetically, numbers by value (rows per expert 1, 64, 128, not 1, 1024, 128)."""
    return [f"{x:012d}" if isinstance(x, int) else str(x) for x in key]


def fmt(x, digits=1):
    return "-" if x is None else f"{x:.{digits}f}"


def time_of(measured):
    return measured.get("time_us") if isinstance(measured, dict) else None


def layer_rows(results):
    """Whole-layer cases: key (model, quant, M) -> (experts[/path], time). The path (decode,
    grouped, hopper) is in results from 2026-12-01's sixth session on."""
    def experts(c):
        return c.get("experts", "") + (f"/{c['path']}" if c.get("path") else "")
    return {(c["model"], c["quant"], c["M"]): (experts(c), c.get("time_us"))
            for c in results["cases"] if "model" in c}


def fc1_rows(results):
    """--gemm FC1 cases: key (shape, dtype, rows per expert) -> (tile, fused, unfused)."""
    return {(c["shape"], c["dtype"], c["rows_per_expert"]):
            (c.get("tile_fused", ""), time_of(c.get("fused")), time_of(c.get("unfused")))
            for c in results["cases"] if c.get("kind") == "fc1"}


def scheduler_rows(results):
    """--gemm scheduler cases: key (dtype, M) -> (tile, ideal, cooperative, linear scan)."""
    return {(c["dtype"], c["M"]):
            (c.get("tile", ""), time_of(c.get("ideal")), time_of(c.get("cooperative")),
             time_of(c.get("linear_scan")))
            for c in results["cases"] if c.get("kind") == "scheduler"}


def ratio(cand, base):
    return cand / base if cand and base else None


class Table:
    def __init__(self, header, markdown):
        self.header, self.markdown, self.rows = header, markdown, []

    def add(self, cells):
        self.rows.append([str(c) for c in cells])

    def print(self):
        if self.markdown:
            print("| " + " | ".join(self.header) + " |")
            print("|" + "---|" * len(self.header))
            for r in self.rows:
                print("| " + " | ".join(r) + " |")
            return
        widths = [max(len(h), *(len(r[i]) for r in self.rows)) for i, h in enumerate(self.header)]
        print("  ".join(h.ljust(w) for h, w in zip(self.header, widths)))
        for r in self.rows:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths)))


def summarize(label, ratios):
    ratios = [r for r in ratios if r is not None]
    if ratios:
        print(f"{label}: cand/base median {statistics.median(ratios):.3f}, "
              f"min {min(ratios):.3f}, max {max(ratios):.3f} over {len(ratios)} cases")


def only_in(base, cand):
    for key in sorted(set(base) ^ set(cand), key=case_order):
        print(f"only in {'base' if key in base else 'candidate'}: {key}")


def compare_layer(base, cand, markdown):
    b, c = layer_rows(base), layer_rows(cand)
    t = Table(["model", "quant", "M", "experts (base → cand)", "base µs", "cand µs", "cand/base"],
              markdown)
    ratios = []
    for key in sorted(set(b) & set(c), key=case_order):
        (eb, tb), (ec, tc) = b[key], c[key]
        r = ratio(tc, tb)
        ratios.append(r)
        experts = eb if eb == ec else f"{eb} → {ec}"
        t.add([key[0], key[1], key[2], experts, fmt(tb), fmt(tc), fmt(r, 3)])
    t.print()
    summarize("whole layer", ratios)
    only_in(b, c)


def compare_gemm(base, cand, markdown):
    b, c = fc1_rows(base), fc1_rows(cand)
    t = Table(["shape", "dtype", "rows/expert", "tile (base → cand)", "base fused µs",
               "cand fused µs", "cand/base", "base unfused µs", "cand unfused µs", "cand/base"],
              markdown)
    fused, unfused = [], []
    for key in sorted(set(b) & set(c), key=case_order):
        (tb, fb, ub), (tc, fc, uc) = b[key], c[key]
        fused.append(ratio(fc, fb))
        unfused.append(ratio(uc, ub))
        tile = tb if tb == tc else f"{tb} → {tc}"
        t.add([key[0], key[1], key[2], tile, fmt(fb), fmt(fc), fmt(fused[-1], 3), fmt(ub), fmt(uc),
               fmt(unfused[-1], 3)])
    if t.rows:
        t.print()
        summarize("fused", fused)
        summarize("unfused", unfused)
    only_in(b, c)
    b, c = scheduler_rows(base), scheduler_rows(cand)
    if not (set(b) & set(c)):
        return
    print()
    t = Table(["dtype", "M", "tile", "base ideal µs", "cand ideal µs", "base coop %",
               "cand coop %", "base linear %", "cand linear %"], markdown)

    def overhead(t_us, ideal):
        return 100 * (t_us / ideal - 1) if t_us and ideal else None

    for key in sorted(set(b) & set(c), key=case_order):
        (tile_b, ib, cb, lb), (tile_c, ic, cc, lc) = b[key], c[key]
        tile = tile_b if tile_b == tile_c else f"{tile_b} → {tile_c}"
        t.add([key[0], key[1], tile, fmt(ib, 2), fmt(ic, 2), fmt(overhead(cb, ib)),
               fmt(overhead(cc, ic)), fmt(overhead(lb, ib)), fmt(overhead(lc, ic))])
    t.print()
    only_in(b, c)


def kind(results, path):
    cases = results.get("cases", [])
    if any("model" in c for c in cases):
        return "layer"
    if any(c.get("kind") in ("fc1", "scheduler") for c in cases):
        return "gemm"
    sys.exit(f"{path}: neither modmoe-bench --json nor --gemm --json results")


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet when piped into head
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("base")
    p.add_argument("candidate")
    p.add_argument("--markdown", action="store_true", help="tables for docs/perf.md")
    args = p.parse_args()
    with open(args.base) as f:
        base = json.load(f)
    with open(args.candidate) as f:
        cand = json.load(f)
    kb, kc = kind(base, args.base), kind(cand, args.candidate)
    if kb != kc:
        sys.exit(f"the files hold different kinds of results ({kb} vs {kc})")
    (compare_layer if kb == "layer" else compare_gemm)(base, cand, args.markdown)


if __name__ == "__main__":
    main()
