#!/usr/bin/env bash
# Session 25, call 2: the bf16 swapped 144x256 tile (consume_swapped; the heuristic gives it plain
# bf16 GEMMs of K >= 4096 where its waves x 144 rows beat 64x256's and 128x256's: Mixtral M = 1024's
# GEMM2), the working tree, against HEAD's sources in .ab-base. The Hopper GEMM, experts, route
# and graph tests first (a failure stops it); then every standard layer at M = 1024 and 8192
# (only Mixtral bf16 M = 1024 should change tile) with the cuBLAS baseline, alternated; memcheck
# of the swapped tile's tests; the candidate's kernel list of Mixtral bf16 M = 1024 (ncu).
# Here first: `scripts/gpu-ab prepare HEAD`; carry .deps and .ab-base. ~8 minutes.
set -u
cd "$(dirname "$0")/../../.."
git status --short -- src include tools | head -8
scripts/gpu-ab run --tests '*Sm90*:Routes/*:*GraphCapture*:CudaPairs*' \
  --bench "--shapes standard --ms 1024,8192 --quants none" --alternate > "$OUT/run.log" 2>&1
rc=$?
echo "gpu-ab rc=$rc"
export PATH="$PATH:/usr/local/cuda/bin"
if [ $rc -eq 0 ]; then
  timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 build-gpu/tests/modmoe_gpu_tests \
    --gtest_brief=1 --gtest_filter='Sm90GemmUnaligned.Bf16Swapped*:Sm90GemmUnaligned.FewCtas*' \
    > "$OUT/memcheck.log" 2>&1
  echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY|PASSED|FAILED' "$OUT/memcheck.log" | tr '\n' ' ')"
  cmake --build build-gpu --target modmoe-profile -j 16 > /dev/null 2>&1
  timeout 120 scripts/gpu-kernels mixtral-8x7b none 1024 > "$OUT/kernels-mixtral-bf16-1024.txt" 2>&1
  tail -n 9 "$OUT/kernels-mixtral-bf16-1024.txt"
fi
grep -E "^(gpu-ab: cand|\[  (PASSED|FAILED)|model|whole|[a-z0-9.-]+ +(none|fp8-block))" "$OUT/ab.txt" |
  head -60
tar -xzOf "$OUT/logs.tar.gz" ./tests.log 2>/dev/null | grep -E "FAILED|Failure" | head -20
