#!/usr/bin/env bash
# PREPARED for the next session (not run in the thirtieth): the fp8 128x128 tile's consumers run
# their K blocks in pairs (…-s30-patches/fp8-128x128-loop-in-pairs.patch; the 64-row tiles keep
# the one-wait loop) against HEAD: the Hopper, route, pair and graph tests on the candidate, the
# default tiles (no standard case should move: none runs fp8-block 128x128 by default), then
# plain GEMMs forced onto 128x128 in both (where the thirtieth session's all-tiles form measured
# Mixtral fp8 M = 1024 / 8192 0.961 / 0.969). Here first: `scripts/gpu-ab prepare HEAD`; carry
# .deps and .ab-base. ~6 minutes. Then, if kept, a gpu-check.
set -u
cd "$(dirname "$0")/../../.."  # the repository root
P=bench/results/2026-12-04-h200-s30-patches/fp8-128x128-loop-in-pairs.patch
scripts/gpu-ab run --patch "$P" --tests '*Sm90*:Routes/*:*GraphCapture*:CudaPairs*' \
  --bench "--shapes standard --quants fp8-block --ms 16,128,1024 --no-baseline" > "$OUT/run.log" 2>&1
echo "gpu-ab run rc=$?"
cp "$OUT/ab.txt" "$OUT/ab-default-tiles.txt"
MODMOE_SM90_TILE_PLAIN=128x128 scripts/gpu-ab time /tmp/gpu-ab-base/tools/modmoe-bench \
  build-gpu/tools/modmoe-bench --bench "--shapes standard --models mixtral-8x7b,qwen3.5-35b-a3b,deepseek-v3 --ms 1024,8192 --quants fp8-block --no-baseline" \
  --alternate >> "$OUT/run.log" 2>&1
echo "gpu-ab time rc=$?"
for f in ab-default-tiles.txt ab.txt; do
  echo "== $f"
  grep -E "^(gpu-ab: cand|\[  (PASSED|FAILED)|model|whole|[a-z0-9.-]+ +fp8-block)" "$OUT/$f" | head -40
done
