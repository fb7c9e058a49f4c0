#!/usr/bin/env bash
# Session 26, call 2: the row copy (copy_rows_kernel: the bf16 gather of Sm90Experts, the batched
# scatter/gather) with 4 units in flight per thread (all loaded, then all stored; registers capped
# for 6 blocks of 256; no fewer than 132 blocks where there are enough units), the working tree,
# against HEAD's sources in .ab-base. The batched, quantization, Hopper-experts, route, pair and
# graph tests first (a failure stops it); every standard bf16 layer at M = 16, 1024, 8192,
# alternated; memcheck of the copy tests; both sides' kernel lists of Mixtral bf16 M = 1024 (ncu).
# Here first: `scripts/gpu-ab prepare HEAD`; carry .deps and .ab-base. ~8 minutes.
set -u
cd "$(dirname "$0")/../../.."
git status --short -- src include tools | head -8
scripts/gpu-ab run --tests 'CudaBatched.*:CudaQuant.*:*Sm90Experts*:Routes/*:*GraphCapture*:CudaPairs*:CudaPermute*' \
  --bench "--shapes standard --ms 16,1024,8192 --quants none" --alternate > "$OUT/run.log" 2>&1
rc=$?
echo "gpu-ab rc=$rc"
export PATH="$PATH:/usr/local/cuda/bin"
if [ $rc -eq 0 ]; then
  timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 build-gpu/tests/modmoe_gpu_tests \
    --gtest_brief=1 --gtest_filter='CudaBatched.*:CudaQuant.Scatter*' > "$OUT/memcheck.log" 2>&1
  echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY|PASSED|FAILED' "$OUT/memcheck.log" | tr '\n' ' ')"
  cmake --build build-gpu --target modmoe-profile -j 16 > /dev/null 2>&1 &
  cmake --build /tmp/gpu-ab-base --target modmoe-profile -j 16 > /dev/null 2>&1
  wait
  timeout 60 scripts/gpu-kernels mixtral-8x7b none 1024 > "$OUT/kernels-cand-mixtral-bf16-1024.txt" 2>&1
  BUILD=/tmp/gpu-ab-base timeout 60 scripts/gpu-kernels mixtral-8x7b none 1024 \
    > "$OUT/kernels-base-mixtral-bf16-1024.txt" 2>&1
  tail -n 8 "$OUT/kernels-base-mixtral-bf16-1024.txt" "$OUT/kernels-cand-mixtral-bf16-1024.txt"
fi
grep -E "^(gpu-ab: cand|\[  (PASSED|FAILED)|model|whole|[a-z0-9.-]+ +(none|fp8-block))" "$OUT/ab.txt" |
  head -60
tar -xzOf "$OUT/logs.tar.gz" ./tests.log 2>/dev/null | grep -E "FAILED|Failure" | head -20
