#!/usr/bin/env bash
# Session 30 call 2: the multi-block counting sort summing block_counts with the whole block
# (working tree) against HEAD. Here first: `scripts/gpu-ab prepare HEAD`; carry .deps and .ab-base.
set -u
cd "$(dirname "$0")/../../.."  # the repository root
scripts/gpu-ab run --tests 'CudaPermutePaths.*:*GraphCapture*:Routes/*:CudaPairs*' \
  --bench "--shapes standard --ms 1024,8192 --quants fp8-block --no-baseline" --alternate > "$OUT/run.log" 2>&1
rc=$?
echo "gpu-ab rc=$rc"
if [ $rc -eq 0 ]; then
  scripts/gpu-ab kernels qwen3.5-35b-a3b fp8-block 8192 > /dev/null 2>&1
  scripts/gpu-ab kernels qwen3-30b-a3b fp8-block 1024 > /dev/null 2>&1
fi
grep -E "^(gpu-ab: cand|\[  (PASSED|FAILED)|model|whole|median|[a-z0-9.-]+ +(none|fp8-block))" "$OUT/ab.txt" | head -60
tar -xzOf "$OUT/logs.tar.gz" ./tests.log 2>/dev/null | grep -E "FAILED|Failure" | head -20
for f in "$OUT"/kernels-*.txt; do echo "== $f"; head -12 "$f"; done
