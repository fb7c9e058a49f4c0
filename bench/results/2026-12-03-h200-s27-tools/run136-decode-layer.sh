#!/usr/bin/env bash
# Session 27, calls 2 and 4: the persistent decode layer (src/cuda/decode_layer.cu), first run on the GPU.
# Builds build-gpu (tests + bench), runs the decode tests (both MODMOE_DECODE_LAYER settings),
# memcheck + racecheck over them, then times the standard models at M = 1, 4, 8 with the
# layer (MODMOE_DECODE_LAYER=1) against the separate kernels (unset: the rule, off), alternated.
set -u
cd "$(dirname "$0")/../../.."
log="$OUT/run.log"
t0=$(date +%s)
scripts/gpu-build --build build-gpu --jobs 16 modmoe-bench modmoe_gpu_tests > "$OUT/build.log" 2>&1
echo "build rc=$? $(( $(date +%s) - t0 )) s" | tee -a "$log"
tests=build-gpu/tests/modmoe_gpu_tests
filter='Cases/DecodeMlp.*:DecodeRoute.*:*GraphCapture*'
timeout 240 $tests --gtest_filter="$filter" > "$OUT/tests.log" 2>&1
echo "tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/tests.log" | tr '\n' ' ')" | tee -a "$log"
grep -E "FAILED|Failure|error|Expected|Which is|MODMOE" "$OUT/tests.log" | head -40 | tee -a "$log"
if grep -q "^\[  PASSED  \]" "$OUT/tests.log" && ! grep -q "^\[  FAILED" "$OUT/tests.log"; then
  timeout 150 compute-sanitizer --tool memcheck $tests \
    --gtest_filter='Cases/DecodeMlp.*MatchesTheOracle*' > "$OUT/memcheck.log" 2>&1
  echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1)" | tee -a "$log"
  timeout 120 compute-sanitizer --tool racecheck $tests \
    --gtest_filter='Cases/DecodeMlp.MatchesTheOracle/fp8_M1' \
    > "$OUT/racecheck.log" 2>&1
  echo "racecheck rc=$? $(grep -E 'RACECHECK SUMMARY' "$OUT/racecheck.log" | tail -1)" | tee -a "$log"
  timeout 260 scripts/gpu-ab env "MODMOE_DECODE_LAYER=1" \
    --bench "--shapes standard --ms 1,4,8" --alternate > "$OUT/ab.log" 2>&1
  echo "gpu-ab rc=$?" | tee -a "$log"
  grep -E "^(model|whole|[a-z0-9.-]+ +(none|fp8-block))" "$OUT/ab.txt" | head -90
fi
echo "total $(( $(date +%s) - t0 )) s"
