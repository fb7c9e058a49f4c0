#!/usr/bin/env bash
# Session 25, call 1: the reduce with more column vectors per thread at small topk (reduce.cu:
# kKChunk x kColVecs = 8 loads in flight; topk <= 2 takes 4 column vectors, topk <= 4 two), the
# working tree, against HEAD's sources in .ab-base. The reduce and every test that runs it first
# (a failure stops it), then the topk = 2 / 4 layers (Mixtral, gpt-oss) and one topk = 8 control
# (Qwen3.5, whose kernel is unchanged) at M = 16-8192, alternated; memcheck over CudaReduce.*;
# then the candidate's kernel lists (ncu) of Mixtral bf16 M = 1024 and 8192.
# Here first: `scripts/gpu-ab prepare HEAD`; carry .deps and .ab-base. ~7 minutes.
set -u
cd "$(dirname "$0")/../../.."
git status --short -- src include tools | head -5
scripts/gpu-ab run --tests 'CudaReduce*:CudaPairs*:*GraphCapture*:*Sm90Experts*:CudaBatched*:Cases/*' \
  --bench "--shapes standard --models mixtral-8x7b,gpt-oss-120b,qwen3.5-35b-a3b --ms 16,128,1024,8192 --no-baseline" \
  --alternate > "$OUT/run.log" 2>&1
rc=$?
echo "gpu-ab rc=$rc"
export PATH="$PATH:/usr/local/cuda/bin"
if [ $rc -eq 0 ]; then
  timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 build-gpu/tests/modmoe_gpu_tests \
    --gtest_brief=1 --gtest_filter='CudaReduce*' > "$OUT/memcheck.log" 2>&1
  echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY|PASSED|FAILED' "$OUT/memcheck.log" | tr '\n' ' ')"
  cmake --build build-gpu --target modmoe-profile -j 16 > "$OUT/profile-build.log" 2>&1
  for m in 1024 8192; do
    timeout 120 scripts/gpu-kernels mixtral-8x7b none $m > "$OUT/kernels-mixtral-bf16-$m.txt" 2>&1
    tail -n 12 "$OUT/kernels-mixtral-bf16-$m.txt"
  done
fi
grep -E "^(gpu-ab: cand|\[  (PASSED|FAILED)|model|whole|[a-z0-9.-]+ +(none|fp8-block))" "$OUT/ab.txt" |
  grep -v -E "hopper|grouped" | head -90
