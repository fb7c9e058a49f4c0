#!/usr/bin/env bash
# PREPARED (not run in the thirty-first session; run it if run160's halves256-skewed beats
# halves256-barriers): the fp8 128x256 tile's consumer 1 takes its accumulator halves in the
# other order (…-s31-patches/fp8-128x256-skewed-halves.patch: its B fields and weight-scale
# cursors swapped at the tile's start, its accumulators swapped back after the main loop; the
# loop itself unchanged; ptxas: the non-split kernel 8 bytes spilled (HEAD 12), the split one 20
# (HEAD 8), outside the K loop). Against HEAD: the Hopper, route, pair and graph tests on the
# candidate, the fp8 layers at M = 1024 and 8192 alternated, the kernel lists of Qwen3.5 fp8
# M = 8192. Here first: `scripts/gpu-ab prepare HEAD`; carry .deps and .ab-base. ~4 minutes.
set -u
cd "$(dirname "$0")/../../.."  # the repository root
P=bench/results/2026-12-04-h200-s31-patches/fp8-128x256-skewed-halves.patch
scripts/gpu-ab run --patch "$P" --tests '*Sm90*:Routes/*:*GraphCapture*:CudaPairs*' \
  --bench "--shapes standard --quants fp8-block --ms 1024,8192 --no-baseline" --alternate \
  > "$OUT/run.log" 2>&1
echo "gpu-ab run rc=$?"
scripts/gpu-ab kernels qwen3.5-35b-a3b fp8-block 8192 >> "$OUT/run.log" 2>&1
grep -E "^(gpu-ab: cand|\[  (PASSED|FAILED)|model|whole|[a-z0-9.-]+ +fp8-block)" "$OUT/ab.txt" | head -40
for f in "$OUT"/kernels-*.txt; do echo "== $f"; sed -n 3,9p "$f"; done
