#!/usr/bin/env bash
# Session 29 call 5: the fp8 128x256 tail split (working tree) against HEAD, with the Hopper
# tests and memcheck / racecheck of the unaligned suite on the candidate.
# Here first: `scripts/gpu-ab prepare HEAD`; carry .deps, .ab-base and build-run.
set -u
cd "$(dirname "$0")/../../.."  # the repository root (as run: from build-run/, one level up)
export PATH="$PATH:/usr/local/cuda/bin"
scripts/gpu-ab run --tests '*Sm90*:Routes/*:*GraphCapture*:CudaPairs*' \
  --bench "--shapes standard --ms 8192 --quants fp8-block --models qwen3-30b-a3b,qwen3.5-35b-a3b,deepseek-v3 --no-baseline" \
  --alternate > "$OUT/run.log" 2>&1
rc=$?
echo "gpu-ab rc=$rc"
grep -E "^(gpu-ab: cand|\[  (PASSED|FAILED)|model|whole|[a-z0-9.-]+ +(none|fp8-block))" "$OUT/ab.txt" | head -30
tar -xzOf "$OUT/logs.tar.gz" ./tests.log 2>/dev/null | grep -E "FAILED|Failure" | head -20
if [ $rc -eq 0 ]; then
  timeout 120 compute-sanitizer --tool memcheck build-gpu/tests/modmoe_gpu_tests \
    --gtest_filter='Sm90GemmUnaligned.*' > "$OUT/memcheck.log" 2>&1
  echo "memcheck rc=$?: $(grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/memcheck.log" | tr '\n' ' ')"
  timeout 90 compute-sanitizer --tool racecheck build-gpu/tests/modmoe_gpu_tests \
    --gtest_filter='Sm90GemmUnaligned.Fp8TailTiles*' > "$OUT/racecheck.log" 2>&1
  echo "racecheck rc=$?: $(grep -E "RACECHECK SUMMARY|PASSED|FAILED" "$OUT/racecheck.log" | tr '\n' ' ')"
  scripts/gpu-ab kernels qwen3.5-35b-a3b fp8-block 8192 > /dev/null 2>&1
  cat "$OUT"/kernels-*.txt 2>/dev/null
fi
