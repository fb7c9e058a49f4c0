#!/usr/bin/env bash
# PREPARED (not run in the thirty-second session): the weighted reduce after GEMM2 launched
# programmatically in the same decode-sized applies as the GEMMs (…-s32-patches/
# reduce-programmatic.patch: WeightedReduceArgs::programmatic; the blocks load their rows'
# indices and weights, then griddepcontrol.wait, then y). Predicted: 0.5-1.5 us off the fp8
# M = 16 / 128 layers (the reduce's launch and index loads under GEMM2's tail; Qwen3.5 fp8 M = 16
# needs 0.7 us at the thirty-second session's line), nothing elsewhere. Here first:
# `scripts/gpu-ab prepare HEAD`; carry .deps and .ab-base. ~4 minutes.
set -u
cd "$(dirname "$0")/../../.."  # the repository root
P=bench/results/2026-12-04-h200-s32-patches/reduce-programmatic.patch
scripts/gpu-ab run --patch "$P" --tests '*Sm90*:Routes/*:*GraphCapture*:CudaPairs*:CudaReduce*' \
  --bench "--shapes standard --quants fp8-block --ms 16,128 --no-baseline" --alternate \
  > "$OUT/run.log" 2>&1
echo "gpu-ab run rc=$?"
grep -E "^(gpu-ab: cand|\[  (PASSED|FAILED)|model|whole|[a-z0-9.-]+ +fp8-block)" "$OUT/ab.txt" | head -30
