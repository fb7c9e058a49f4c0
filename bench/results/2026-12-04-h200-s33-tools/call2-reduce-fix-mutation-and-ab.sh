#!/usr/bin/env bash
# Thirty-third session, call 2. Call 1's A/B of the programmatic weighted reduce stopped at its
# tests: CudaCombinations NoEP_Sm90_shape6_fp8_block_bf16 (chunks of 100 tokens, so decode-sized
# applies) was wrong. The SASS showed why: src, __restrict__, was loaded non-coherently and the
# loads were hoisted above griddepcontrol.wait. The working tree drops __restrict__ from src and
# adds a test (ProgrammaticReduce.*: a late writer, then the reduce programmatically).
# (a) mutation: with __restrict__ back (…-s33-patches/mutation-reduce-src-restrict.patch) the new
#     test must FAIL; (b) the A/B against HEAD (the tests first, then fp8 M = 16 / 128 alternated;
#     predicted 0.5-1.5 us off); (c) if time is left, M = 8192 (the reduce's largest case: the
#     plain loads must not be slower than the non-coherent ones).
set -u
cd "$(dirname "$0")/../../.."  # the repository root
t0=$(date +%s)
P=bench/results/2026-12-04-h200-s33-patches/mutation-reduce-src-restrict.patch
{
  echo "== mutation (expected: FAILED)"
  git apply $P || exit 1
  grep -n "weighted_reduce_kernel(const" src/cuda/reduce.cu
  scripts/gpu-build --source . --build /tmp/mut --jobs 16 modmoe_gpu_tests > /tmp/mut-build.log 2>&1 ||
    { tail -5 /tmp/mut-build.log; }
  timeout 60 /tmp/mut/tests/modmoe_gpu_tests --gtest_filter='ProgrammaticReduce*' 2>&1 |
    grep -E "Failure|non-finite|FAILED|PASSED|OK \]|Expected|Which" | head -8
  git apply -R $P
  echo "mutation done at $(( $(date +%s) - t0 )) s"
} 2>&1 | tee "$OUT/mutation.txt"
echo "== A/B"
scripts/gpu-ab run --tests '*Programmatic*:*Sm90*:Routes/*:*GraphCapture*:CudaPairs*:CudaReduce*:*Combinations*' \
  --bench "--shapes standard --quants fp8-block --ms 16,128 --no-baseline" --alternate \
  > "$OUT/run.log" 2>&1
echo "gpu-ab run rc=$? at $(( $(date +%s) - t0 )) s"
grep -E "^(gpu-ab: cand|\[  (PASSED|FAILED)|model|whole|[a-z0-9.-]+ +fp8-block)|FAILED|Failure" "$OUT/ab.txt" | head -40
if [ $(( $(date +%s) - t0 )) -lt 430 ]; then
  echo "== M = 8192"
  mkdir -p /tmp/t2
  OUT=/tmp/t2 scripts/gpu-ab time /tmp/gpu-ab-base/tools/modmoe-bench build-gpu/tools/modmoe-bench \
    --bench "--shapes standard --models qwen3.5-35b-a3b,deepseek-v3 --ms 8192 --no-baseline" \
    > /tmp/t2/time.log 2>&1
  grep -E "model|whole|[a-z0-9.-]+ +(none|fp8-block)" /tmp/t2/ab.txt | head -12
  tar czf "$OUT/m8192.tar.gz" -C /tmp/t2 .
fi
echo "total $(( $(date +%s) - t0 )) s"
