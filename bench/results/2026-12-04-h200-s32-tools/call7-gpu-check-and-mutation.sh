#!/usr/bin/env bash
# Thirty-second session, call 7: gpu-check of the working tree (the decode-sized GEMMs launched
# programmatically; the new Sm90Programmatic test in the memcheck set too), then the mutation
# check call 6 got wrong: the Sm90Programmatic test (now with a ~2 ms late writer) rebuilt with
# the producer's wait removed (…-s32-patches/mutation-producer-no-wait.patch) must FAIL.
set -u
cd "$(dirname "$0")/../../.."  # the repository root
MODMOE_GPU_CHECK_BUDGET=420 \
MODMOE_MEMCHECK_FILTER='Sm90GemmUnaligned.*:CudaPairs/GraphCapture.*:Cases/DecodeMlp.*:CudaQuant.*:CudaReduce.*:CudaBatched.*:Routes/Sm90ExpertsQuantizeInput.*:CudaPermutePaths.*:CudaFastActivation.*:Sm90Programmatic.*' \
MODMOE_RACECHECK_FILTER='Cases/DecodeMlp.*:Routes/Sm90ExpertsQuantizeInput.*:CudaPermutePaths.SingleBlock*:CudaPermutePaths.Automatic*:Sm90GemmUnaligned.Bf16Swapped*' \
  bash scripts/gpu-check --steps build,tests,check,bench,memcheck,racecheck > "$OUT/gpu-check-stdout.log" 2>&1
echo "gpu-check rc=$?"
git apply bench/results/2026-12-04-h200-s32-patches/mutation-producer-no-wait.patch &&
  cmake --build build-gpu --target modmoe_gpu_tests -j 16 > /tmp/mut-build.log 2>&1 &&
  { timeout 120 build-gpu/tests/modmoe_gpu_tests --gtest_filter='Sm90Programmatic*' > /tmp/mut.txt 2>&1;
    echo "mutation test run rc=$? (expected: non-zero)" >> /tmp/mut.txt;
    grep -E "Failure|non-finite|relative|FAILED|PASSED|rc=" /tmp/mut.txt | head -12 | tee -a "$OUT/gpu-check-stdout.log"; } ||
  { echo "mutation build failed"; tail -5 /tmp/mut-build.log; }
git apply -R bench/results/2026-12-04-h200-s32-patches/mutation-producer-no-wait.patch
tail -45 "$OUT/gpu-check-stdout.log"
