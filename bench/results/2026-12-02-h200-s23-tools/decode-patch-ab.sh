#!/usr/bin/env bash
# decode-patch-ab.sh PATCH: the A/B this session ran for each decode `down` candidate, on the GPU
# machine — PATCH applied to the working tree (scripts/gpu-ab run --patch) against HEAD's sources
# in .ab-base; the decode and graph-capture tests first (a failure stops it); M = 1-4 of the
# standard models, alternated; then memcheck and racecheck over Cases/DecodeMlp.* (and whatever
# DecodeRoute tests the patch adds: SANITIZE_EXTRA=':DecodeRoute.Foo*'). Prints the comparison.
# Here first: `scripts/gpu-ab prepare HEAD`; carry .deps and .ab-base. ~5 minutes.
set -u
patch=${1:?decode-patch-ab.sh: which patch?}
cd "$(dirname "$0")/../../.."
scripts/gpu-ab run --patch "$patch" --tests 'Cases/DecodeMlp.*:DecodeRoute*:*GraphCapture*' \
  --bench "--shapes standard --ms 1,2,3,4 --no-baseline" --alternate > "$OUT/run.log" 2>&1
rc=$?
echo "gpu-ab rc=$rc"
export PATH="$PATH:/usr/local/cuda/bin"
if [ $rc -eq 0 ]; then
  for tool in memcheck racecheck; do
    timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 build-gpu/tests/modmoe_gpu_tests \
      --gtest_brief=1 --gtest_filter="Cases/DecodeMlp.*${SANITIZE_EXTRA:-}" > "$OUT/$tool.log" 2>&1
    echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|PASSED|FAILED' "$OUT/$tool.log" | tr '\n' ' ')"
  done
fi
grep -E "^(gpu-ab: cand|\[  (PASSED|FAILED)|model|whole|[a-z0-9.-]+ +(none|fp8-block))" "$OUT/ab.txt" |
  grep -v -E "hopper|grouped" | head -90
