#!/usr/bin/env bash
# Session 24, call 2: ModularKernel's two workspaces in one allocation (the working tree) against
# bf2077e (.ab-base: `scripts/gpu-ab prepare bf2077e` here; carry .deps and .ab-base). The
# graph-capture, decode, modular-kernel and arena tests first (a failure stops it), then M = 1
# and 16 of the standard models, alternated (two rounds). ~4 minutes.
# Predicted: M = 1 layers 0.4-0.6 us faster (two memory nodes of 0.2-0.3 us fewer: perf.md s22),
# M = 16 within +-1 %.
set -u
cd "$(dirname "$0")/../../.."
scripts/gpu-ab run --tests '*GraphCapture*:Cases/DecodeMlp.*:DecodeRoute*:*ModularKernel*:*Arena*' \
  --bench "--shapes standard --ms 1,16 --no-baseline" --alternate > "$OUT/run.log" 2>&1
echo "gpu-ab rc=$?"
grep -E "^(gpu-ab: cand|\[  (PASSED|FAILED)|model|whole|[a-z0-9.-]+ +(none|fp8-block))" "$OUT/ab.txt" |
  head -70
