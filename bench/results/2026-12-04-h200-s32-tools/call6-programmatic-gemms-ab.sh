#!/usr/bin/env bash
# Thirty-second session, call 6: Sm90Experts' decode-sized GEMMs (<= 16 rows per busy expert)
# launched programmatically (the working tree) against HEAD. (1) The candidate's tests: the new
# Sm90Programmatic case, the Hopper, route, pair, graph, decode, quantization and batched
# tests. (2) The layers at M = 16 and 128, both quants, alternated. (3) The kernel lists of
# Qwen3.5 fp8 M = 16. (4) The new test against a mutation (the producer's wait removed,
# …-s32-patches/mutation-producer-no-wait.patch): it must fail there. Here first:
# `scripts/gpu-ab prepare HEAD`; carry .deps and .ab-base.
set -u
cd "$(dirname "$0")/../../.."  # the repository root
scripts/gpu-ab run --tests '*Sm90*:Routes/*:*GraphCapture*:CudaPairs*:*DecodeMlp*:CudaQuant*:CudaBatched*' \
  --bench "--shapes standard --ms 16,128 --no-baseline" --alternate > "$OUT/run.log" 2>&1
echo "gpu-ab run rc=$?"
scripts/gpu-ab kernels qwen3.5-35b-a3b fp8-block 16 >> "$OUT/run.log" 2>&1
grep -E "^(gpu-ab: cand|\[  (PASSED|FAILED)|model|whole|[a-z0-9.-]+ +(fp8-block|none))" "$OUT/ab.txt" | head -50
for f in "$OUT"/kernels-*.txt; do echo "== $f"; sed -n 3,9p "$f"; done
git apply bench/results/2026-12-04-h200-s32-patches/mutation-producer-no-wait.patch &&
  cmake --build build-gpu --target modmoe_gpu_tests -j 16 > /tmp/mut-build.log 2>&1 &&
  { timeout 300 build-gpu/tests/modmoe_gpu_tests --gtest_filter='Sm90Programmatic*' 2>&1 | tail -12 > /tmp/mut.txt;
    echo "mutation test run rc=${PIPESTATUS[0]}" >> /tmp/mut.txt; cat /tmp/mut.txt; cat /tmp/mut.txt >> "$OUT/run.log"; } ||
  { echo "mutation build failed"; tail -5 /tmp/mut-build.log; }
git apply -R bench/results/2026-12-04-h200-s32-patches/mutation-producer-no-wait.patch
