#!/usr/bin/env bash
# Session 30 calls 1, 3 and 4: the fp8 consumer main-loop schedules' tensor rates (fp8_loop_bench.cu).
set -u
cd "$(dirname "$0")/../../.."  # the repository root
T=bench/results/2026-12-04-h200-s30-tools
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv | tee "$OUT/gpu.txt"
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Isrc -Iinclude -Xptxas -v $T/fp8_loop_bench.cu \
  -o /tmp/flb > "$OUT/ptxas.txt" 2>&1 || { tail -20 "$OUT/ptxas.txt"; exit 1; }
grep -c C75 "$OUT/ptxas.txt"
/tmp/flb | tee "$OUT/fp8-loop-bench.txt"
cuobjdump -sass /tmp/flb > /tmp/flb.sass 2>&1
for v in 0 10 11 12; do
  echo "variant $v: $(awk -v pat="loop_benchILi${v}E" '$0 ~ "Function" {on = index($0, pat) > 0} on' /tmp/flb.sass | grep -oE "(QGMMA|WARPGROUP)[.A-Z0-9]*" | sort | uniq -c | tr '\n' ' ')"
done | tee -a "$OUT/fp8-loop-bench.txt"
