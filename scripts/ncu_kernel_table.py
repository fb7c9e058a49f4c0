#!/usr/bin/env python3
"""ncu --csv --print-units base output (one row per kernel and metric) -> one line per kernel.

Used by scripts/gpu-kernels. Columns: launch order, kernel (short name), time, DRAM read and
written, DRAM throughput as a share of its peak; then the sum of the times.
"""
import csv
import re
import sys


def short_name(name: str) -> str:
    # "void modmoe::cuda::(anonymous namespace)::decode_down_kernel<unsigned char, float>(...)"
    base = name.replace("(anonymous namespace)::", "")
    base = re.sub(r"^void ", "", base)
    base = re.sub(r"[<(].*", "", base)  # template arguments, parameters
    return base.split("::")[-1] or name[:36]


def main(path: str) -> int:
    with open(path, errors="replace") as f:
        text = f.read()
    rows = [r for r in csv.reader(text.splitlines()) if len(r) > 10]
    if len(rows) < 2:
        print("  ncu wrote no kernel rows; its output:")
        for line in text.splitlines()[-15:]:
            print("  " + line)
        return 1
    head = rows[0]
    col = {k: head.index(k) for k in ("ID", "Kernel Name", "Metric Name", "Metric Value")}
    kernels = {}
    for r in rows[1:]:
        key = int(r[col["ID"]])
        k = kernels.setdefault(key, {"name": short_name(r[col["Kernel Name"]])})
        k[r[col["Metric Name"]]] = float(r[col["Metric Value"]].replace(",", ""))
    print(f"  {'#':>3}  {'kernel':<36} {'us':>9} {'read MB':>9} {'write MB':>9} {'DRAM %':>7}")
    total = 0.0
    for key in sorted(kernels):
        k = kernels[key]
        us = k.get("gpu__time_duration.sum", 0.0) / 1e3
        total += us
        print(f"  {key:>3}  {k['name'][:36]:<36} {us:9.1f} "
              f"{k.get('dram__bytes_read.sum', 0.0) / 1e6:9.1f} "
              f"{k.get('dram__bytes_write.sum', 0.0) / 1e6:9.1f} "
              f"{k.get('dram__throughput.avg.pct_of_peak_sustained_elapsed', 0.0):7.1f}")
    print(f"  {len(kernels)} kernels, {total:.1f} us in all (each alone, caches flushed)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
