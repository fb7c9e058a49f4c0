#!/usr/bin/env python3
"""Read the SASS source page that ncu exports and say where a kernel's time goes.

    ncu -i REPORT.ncu-rep --page source --print-source sass --csv > source.csv
    python3 bench/ncu_source.py source.csv                  # the launches in the file
    python3 bench/ncu_source.py source.csv --top 40 -l 1    # launch 1's hottest instructions
    python3 bench/ncu_source.py source.csv --mix -l 1       # opcodes of its hottest loop body
    python3 bench/ncu_source.py source.csv --diff 0 8       # where launch 0 spends more than 8

A launch's table has one row per SASS instruction: warp-stall samples (the time a warp sat on
it, by reason) and how often it executed. Two launches of the same binary (fused and unfused,
say) line up row by row, so --diff finds the code one of them runs and the other does not:
that is how the fp32 division slow path in the fused FC1's epilogue was found (docs/perf.md,
fourth session). ncu may print a launch's table more than once; the index is the table's
position in the file.
"""
import argparse
import collections
import csv
import signal
import sys


def read_launches(path):
    """[(kernel name, header, rows)] in file order."""
    launches = []
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "Kernel Name":
                launches.append([row[1], None, []])
            elif row[0] == "Address" and launches:
                launches[-1][1] = row
            elif launches and launches[-1][1] is not None:
                launches[-1][2].append(row)
    return launches


class Launch:
    def __init__(self, name, header, rows):
        self.name, self.rows = name, rows
        self.col = {h: i for i, h in enumerate(header)}
        self.stalls = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]

    def num(self, row, column):
        value = (row[self.col[column]] if column in self.col else "").replace(",", "").strip()
        return int(value) if value.lstrip("-").isdigit() else 0

    def samples(self, row):
        return self.num(row, "# Samples")

    def executed(self, row):
        return self.num(row, "Instructions Executed")

    def top_stalls(self, row, n=3):
        ranked = sorted(((self.num(row, s), s[len("stall_"):]) for s in self.stalls), reverse=True)
        return " ".join(f"{name}={v}" for v, name in ranked[:n] if v)

    @staticmethod
    def text(row):
        return row[1].strip()


def opcode(instruction):
    words = instruction.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def list_launches(launches):
    for i, lc in enumerate(launches):
        total = sum(lc.samples(r) for r in lc.rows)
        executed = sum(lc.executed(r) for r in lc.rows)
        print(f"{i:3d}  samples {total:9d}  executed {executed:13d}  {lc.name[:110]}")


def top(lc, n):
    total = sum(lc.samples(r) for r in lc.rows) or 1
    by_reason = collections.Counter()
    for r in lc.rows:
        for s in lc.stalls:
            by_reason[s[len("stall_"):]] += lc.num(r, s)
    print(f"{lc.name[:110]}\n{len(lc.rows)} instructions, {total} samples; by reason: " +
          " ".join(f"{k}={v}" for k, v in by_reason.most_common(10)))
    hottest = sorted(range(len(lc.rows)), key=lambda i: -lc.samples(lc.rows[i]))[:n]
    for i in sorted(hottest):
        r = lc.rows[i]
        print(f"{i:6d} {lc.samples(r):8d} {100 * lc.samples(r) / total:5.1f}% "
              f"{lc.executed(r):12d}  {Launch.text(r)[:64]:64s} {lc.top_stalls(r)}")


def mix(lc, min_executed):
    """Opcode counts of the hottest loop body: a straight-line body's instructions share one
    execution count, so the count whose instructions hold the most samples picks it; with
    --min-executed, every instruction executed at least that often instead."""
    samples_by_count = collections.Counter()
    for r in lc.rows:
        if lc.executed(r) > 0:
            samples_by_count[lc.executed(r)] += lc.samples(r)
    if min_executed:
        body = [r for r in lc.rows if lc.executed(r) >= min_executed]
        what = f"executed >= {min_executed} times"
    else:
        count = samples_by_count.most_common(1)[0][0]
        body = [r for r in lc.rows if lc.executed(r) == count]
        what = f"executed {count} times each (the count holding the most samples)"
    ops = collections.Counter(opcode(Launch.text(r)) for r in body)
    print(f"{len(body)} instructions {what}, {sum(lc.samples(r) for r in body)} samples:")
    print(" ".join(f"{k} {v}" for k, v in ops.most_common()))


def diff(a, b, n):
    if len(a.rows) != len(b.rows):
        sys.exit("the two launches have different code (not the same kernel binary)")
    rows = []
    for i, (ra, rb) in enumerate(zip(a.rows, b.rows)):
        rows.append((a.samples(ra) - b.samples(rb), i, ra, rb))
    print(f"samples: {sum(a.samples(r) for r in a.rows)} vs {sum(b.samples(r) for r in b.rows)}")
    print("instructions where the first launch spends the most more (then executed counts):")
    for d, i, ra, rb in sorted(rows, key=lambda x: -x[0])[:n]:
        print(f"{i:6d} {d:+7d}  {a.samples(ra):7d} {b.samples(rb):7d}  "
              f"{a.executed(ra):11d} {b.executed(rb):11d}  {Launch.text(ra)[:60]:60s} "
              f"{a.top_stalls(ra, 2)}")


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet when piped into head
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("csv", help="ncu --page source --print-source sass --csv output")
    p.add_argument("-l", "--launch", type=int, default=0, help="table index (see the listing)")
    p.add_argument("--top", type=int, metavar="N", help="the N instructions with most samples")
    p.add_argument("--mix", action="store_true", help="opcode counts of the hottest loop body")
    p.add_argument("--min-executed", type=int, default=0,
                   help="--mix: count instructions executed at least this often")
    p.add_argument("--diff", type=int, nargs=2, metavar=("A", "B"),
                   help="instructions where launch A spends more samples than launch B")
    p.add_argument("-n", type=int, default=30, help="--diff: rows to print")
    args = p.parse_args()
    launches = [Launch(*x) for x in read_launches(args.csv) if x[1] is not None]
    if not launches:
        sys.exit(f"{args.csv}: no source table (export with --page source --print-source sass --csv)")
    for index in ([args.launch] + (args.diff or [])):
        if not 0 <= index < len(launches):
            sys.exit(f"launch {index} is not in the file (0..{len(launches) - 1})")
    if args.diff:
        diff(launches[args.diff[0]], launches[args.diff[1]], args.n)
    elif args.top:
        top(launches[args.launch], args.top)
    elif args.mix:
        mix(launches[args.launch], args.min_executed)
    else:
        list_launches(launches)


if __name__ == "__main__":
    main()
