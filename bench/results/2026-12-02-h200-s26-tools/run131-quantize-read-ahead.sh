#!/usr/bin/env bash
# Session 26, call 1: two candidates against HEAD's sources in .ab-base (scripts/gpu-ab prepare HEAD):
#  - the quantization's group path reads rows ahead through a shared-memory ring (cp.async, two
#    steps ahead, destinations beside them) and, for scatters of fanout >= 2, stores 16-byte pairs
#    (lanes 2m, 2m+1 swap their codes; one instruction covers two destination rows);
#  - the fp8 128x256 / 64x256 consumers' scales one K block ahead (fp8_main_loop_by_halves).
# The quantization, Hopper, route, pair and graph tests first (a failure stops it); every standard
# fp8 layer at M = 16, 1024, 8192, alternated; then both sides' kernel lists of Qwen3.5 fp8
# M = 8192 (ncu). Carry .deps and .ab-base. ~9 minutes.
set -u
cd "$(dirname "$0")/../../.."
git status --short -- src include tools | head -8
scripts/gpu-ab run --tests 'CudaQuant.*:*Sm90*:Routes/*:*GraphCapture*:CudaPairs*' \
  --bench "--shapes standard --ms 16,1024,8192 --quants fp8-block" --alternate > "$OUT/run.log" 2>&1
rc=$?
echo "gpu-ab rc=$rc"
export PATH="$PATH:/usr/local/cuda/bin"
if [ $rc -eq 0 ]; then
  cmake --build build-gpu --target modmoe-profile -j 16 > /dev/null 2>&1 &
  cmake --build /tmp/gpu-ab-base --target modmoe-profile -j 16 > /dev/null 2>&1
  wait
  timeout 60 scripts/gpu-kernels qwen3.5-35b-a3b fp8-block 8192 > "$OUT/kernels-cand-qwen35-fp8-8192.txt" 2>&1
  BUILD=/tmp/gpu-ab-base timeout 60 scripts/gpu-kernels qwen3.5-35b-a3b fp8-block 8192 \
    > "$OUT/kernels-base-qwen35-fp8-8192.txt" 2>&1
  timeout 40 scripts/gpu-kernels qwen3.5-35b-a3b fp8-block 16 > "$OUT/kernels-cand-qwen35-fp8-16.txt" 2>&1
  tail -n 9 "$OUT/kernels-base-qwen35-fp8-8192.txt" "$OUT/kernels-cand-qwen35-fp8-8192.txt"
fi
grep -E "^(gpu-ab: cand|\[  (PASSED|FAILED)|model|whole|[a-z0-9.-]+ +(none|fp8-block))" "$OUT/ab.txt" |
  head -60
tar -xzOf "$OUT/logs.tar.gz" ./tests.log 2>/dev/null | grep -E "FAILED|Failure" | head -20
