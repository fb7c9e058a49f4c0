#!/usr/bin/env bash
# Thirty-fourth session, call 5: CudaFp8Codec.FastScaleHasTheExactBitsOnEveryAmax as it is (must
# pass) and under two mutations (each must fail): the reciprocal without its Newton step, and
# the fast range reaching amaxes whose scale is subnormal.
set -u
cd "$(dirname "$0")/../../.."  # the repository root
p=bench/results/2026-12-04-h200-s34-patches
run() {
  scripts/gpu-build --source . --build build-gpu --jobs "$(nproc)" modmoe_gpu_tests > "$OUT/build-$1.log" 2>&1 || { echo "$1: build failed"; tail -5 "$OUT/build-$1.log"; return; }
  build-gpu/tests/modmoe_gpu_tests --gtest_filter='CudaFp8Codec.*' > "$OUT/test-$1.log" 2>&1
  echo "$1: exit $?"; grep -E 'Failure|Expected|Which is|first at|OK \]|FAILED \]|PASSED|ms\)' "$OUT/test-$1.log" | head -8
}
run as-is
git apply "$p/mutation-reciprocal-without-newton-step.patch" && run no-newton-step && git apply -R "$p/mutation-reciprocal-without-newton-step.patch"
git apply "$p/mutation-fast-range-into-subnormal-scales.patch" && run subnormal-range && git apply -R "$p/mutation-fast-range-into-subnormal-scales.patch"
