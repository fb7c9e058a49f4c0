#!/usr/bin/env bash
# Prepared in session 26, not run (no device time left): the gated fp8-out epilogue's general
# store loop (the 128-row tiles' only loop, and partial column blocks of the others) converts
# with e4m3_pair_plain (3 instructions a pair) when both of the thread's rows are plain, instead
# of e4m3_pair (~11) for every pair; the ping-pong tile's compact loop already does so per row.
# ptxas (nvcc 13.0): the same spills as HEAD (the fp8 64x256 kernel's 8 bytes); every kernel
# 3.5-5.5 % more instructions (both conversions unrolled). Predicted: the fp8 prefill GEMM1s
# (128x256, fp8 out) 1-3 % faster (their epilogue is ~60 of Qwen3.5 fp8 M = 8192's 381 us),
# the layers at M = 1024 / 8192 0.5-1.5 %; M <= 128 unchanged.
# Here first: `scripts/gpu-ab prepare HEAD`; carry .deps and .ab-base. ~8 minutes.
set -u
cd "$(dirname "$0")/../../.."
patch=bench/results/2026-12-02-h200-s26-patches/fp8-out-general-loop-plain-pairs.patch
scripts/gpu-ab run --patch "$patch" --tests '*Sm90*:Routes/*:*GraphCapture*:CudaPairs*' \
  --bench "--shapes standard --ms 1024,8192 --quants fp8-block" --alternate > "$OUT/run.log" 2>&1
rc=$?
echo "gpu-ab rc=$rc"
[ $rc -eq 0 ] && scripts/gpu-ab kernels qwen3.5-35b-a3b fp8-block 8192
grep -E "^(gpu-ab: cand|\[  (PASSED|FAILED)|model|whole|[a-z0-9.-]+ +(none|fp8-block))" "$OUT/ab.txt" |
  head -40
tar -xzOf "$OUT/logs.tar.gz" ./tests.log 2>/dev/null | grep -E "FAILED|Failure" | head -20
