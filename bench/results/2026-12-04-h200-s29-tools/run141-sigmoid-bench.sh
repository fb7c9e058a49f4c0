#!/usr/bin/env bash
# Session 29: cost and accuracy of act(gate)*up forms for the gated epilogue (sigmoid_bench.cu).
set -u
cd "$(dirname "$0")/../../.."  # the repository root (as run: from build-run/, one level up)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv | tee "$OUT/gpu.txt"
nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -std=c++17 bench/results/2026-12-04-h200-s29-tools/sigmoid_bench.cu -o /tmp/sb 2>&1 | tail -3
/tmp/sb | tee "$OUT/sigmoid-bench.txt"
cuobjdump -sass /tmp/sb > /tmp/sb.sass 2>&1
for f in 0 1 3 4; do
  echo "form $f (convert): $(awk -v pat="benchILi${f}ELb1E" '$0 ~ "Function" {on = index($0, pat) > 0} on' /tmp/sb.sass | grep -oE "(MUFU|F2FP|FFMA|FMUL|FADD|FMNMX|IADD3|LOP3|IMAD)[.A-Z0-9]*" | sort | uniq -c | sort -rn | head -10 | tr '\n' ' ')"
done | tee -a "$OUT/sigmoid-bench.txt"
