#!/usr/bin/env bash
# Session 29 call 2: the gated epilogue's sigmoid as one tanh.approx (working tree) against HEAD.
# Here first: `scripts/gpu-ab prepare HEAD` (the base: 02a36fd); carry .deps and .ab-base.
set -u
cd "$(dirname "$0")/../../.."  # the repository root (as run: from build-run/, one level up)
scripts/gpu-ab run --tests '*Sm90*:Routes/*:*GraphCapture*:CudaPairs*:*Activation*' \
  --bench "--shapes standard --ms 128,1024,8192 --quants fp8-block,none --no-baseline" --alternate > "$OUT/run.log" 2>&1
rc=$?
echo "gpu-ab rc=$rc"
[ $rc -eq 0 ] && scripts/gpu-ab kernels qwen3.5-35b-a3b fp8-block 8192 > /dev/null 2>&1
grep -E "^(gpu-ab: cand|\[  (PASSED|FAILED)|model|whole|median|[a-z0-9.-]+ +(none|fp8-block))" "$OUT/ab.txt" | head -80
tar -xzOf "$OUT/logs.tar.gz" ./tests.log 2>/dev/null | grep -E "FAILED|Failure" | head -20
cat "$OUT"/kernels-*.txt 2>/dev/null
