#!/usr/bin/env bash
# PREPARED (not run in the thirty-first session): the fp8 by-halves loop alone (fp8_loop_bench.cu,
# the thirtieth session's tool) with three variants added in the thirty-first: halves256 under
# the kernel's stage protocol (full/empty mbarriers per stage, a producer thread; "barriers": no
# data moved, "filled": each stage's A and B bytes written by bulk copies, TMA's path; "skewed":
# barriers, consumer 1 running its halves in the other order, a remedy to try). Against
# halves256 (1.08x the ideal alone, 1.10x with unsynchronized fills) it says whether the stage
# protocol itself — the consumers waiting on the same barriers, in step — is where the real
# kernel's ~1.5x goes (perf.md thirty-first session §1, §5). ~1-2 minutes.
set -u
cd "$(dirname "$0")/../../.."  # the repository root
T=bench/results/2026-12-04-h200-s30-tools
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv | tee "$OUT/gpu.txt"
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Isrc -Iinclude -Xptxas -v $T/fp8_loop_bench.cu \
  -o /tmp/flb > "$OUT/ptxas.txt" 2>&1 || { tail -20 "$OUT/ptxas.txt"; exit 1; }
grep -c C75 "$OUT/ptxas.txt"
timeout 300 /tmp/flb | tee "$OUT/fp8-loop-bench.txt"
