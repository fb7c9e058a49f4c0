#!/usr/bin/env bash
# Session 29 call 6: the fp8 GEMMs' time without block-scale promotion (a study patch: wrong
# outputs, a bound), against HEAD. Here first: `scripts/gpu-ab prepare HEAD`; carry .deps, .ab-base.
set -u
cd "$(dirname "$0")/../../.."  # the repository root (as run: from build-run/, one level up)
patch=bench/results/2026-12-04-h200-s29-patches/study-fp8-loop-without-promotion.patch
scripts/gpu-ab run --patch "$patch" \
  --bench "--shapes standard --ms 8192 --quants fp8-block --models qwen3.5-35b-a3b,deepseek-v3 --no-baseline --no-check" \
  > "$OUT/run.log" 2>&1
echo "gpu-ab rc=$?"
grep -E "^(model|whole|[a-z0-9.-]+ +(none|fp8-block))" "$OUT/ab.txt" | head -10
scripts/gpu-ab kernels qwen3.5-35b-a3b fp8-block 8192 > /dev/null 2>&1
cat "$OUT"/kernels-*.txt 2>/dev/null
