#!/usr/bin/env bash
# Session 23, call 2: the decode `down` split over clusters of two CTAs (the working tree) against
# HEAD's (.ab-base): tests first (a failure stops it), then M = 1-4 of the standard models,
# alternated; then memcheck and racecheck over the decode cases (the cluster barrier and the
# distributed-shared-memory store). Here first: `scripts/gpu-ab prepare HEAD`; carry .deps and
# .ab-base. ~5 minutes.
# As run, the working tree held the change; it is now the patch applied here (--patch).
set -u
cd "$(dirname "$0")/../../.."
scripts/gpu-ab run --patch bench/results/2026-12-02-h200-s23-patches/decode-down-split-over-cluster-pairs.patch \
  --tests 'Cases/DecodeMlp.*:DecodeRoute*:*GraphCapture*' \
  --bench "--shapes standard --ms 1,2,3,4 --no-baseline" --alternate > "$OUT/run.log" 2>&1
rc=$?
echo "gpu-ab rc=$rc"
export PATH="$PATH:/usr/local/cuda/bin"
if [ $rc -eq 0 ]; then
  for tool in memcheck racecheck; do
    timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 build-gpu/tests/modmoe_gpu_tests \
      --gtest_brief=1 --gtest_filter='Cases/DecodeMlp.*:DecodeRoute.Split*' > "$OUT/$tool.log" 2>&1
    echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|PASSED|FAILED' "$OUT/$tool.log" | tr '\n' ' ')"
  done
fi
grep -E "^(gpu-ab: cand|\[  (PASSED|FAILED)|model|whole|[a-z0-9.-]+ +(none|fp8-block))" "$OUT/ab.txt" |
  grep -v -E "hopper|grouped" | head -90
