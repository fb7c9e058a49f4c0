#!/usr/bin/env bash
# Thirty-second session, call 10: the Sm90Programmatic test built from scratch with the
# producer's wait removed (…-s32-patches/mutation-producer-no-wait.patch), after calls 6 and 7
# rebuilt build-gpu incrementally and the test passed there; the probe of call 9 showed that a
# programmatic dependent does start ~2 ms early here. Expected: the test fails.
set -u
cd "$(dirname "$0")/../../.."  # the repository root
git apply bench/results/2026-12-04-h200-s32-patches/mutation-producer-no-wait.patch || exit 1
grep -n -A3 "load_b<C>(map_b, p, t, s \* C::kBK" src/cuda/sm90/sm90_gemm_kernel.cuh
scripts/gpu-build --source . --build /tmp/mut --jobs 16 modmoe_gpu_tests > /tmp/mut-build.log 2>&1 || { tail -5 /tmp/mut-build.log; exit 1; }
timeout 60 /tmp/mut/tests/modmoe_gpu_tests --gtest_filter='Sm90Programmatic*' 2>&1 | grep -E "Failure|non-finite|relative|FAILED|PASSED|OK|Expected|Which" | head -12
git apply -R bench/results/2026-12-04-h200-s32-patches/mutation-producer-no-wait.patch
