#!/usr/bin/env bash
# Session 26, call 4: is the one-wait fp8 main loop (fp8_main_loop_together, the 128x128 tile) any
# closer to the by-halves 128x256 tile on the prefill GEMM2s than in the first sessions? One
# binary (HEAD), MODMOE_SM90_TILE_PLAIN=128x128 against the heuristic's tiles, every standard fp8
# layer at M = 8192, alternated; GEMM2's ncu time of Qwen3.5 fp8 M = 8192 under the override.
# Informs the 128x192 one-wait tile of perf.md s26 "Next". Carry .deps. ~5 minutes.
set -u
cd "$(dirname "$0")/../../.."
scripts/gpu-build --build build-gpu --jobs 16 modmoe-bench modmoe-profile > "$OUT/build.log" 2>&1 ||
  { tail -20 "$OUT/build.log"; exit 1; }
scripts/gpu-ab env "MODMOE_SM90_TILE_PLAIN=128x128" \
  --bench "--shapes standard --ms 8192 --quants fp8-block --no-baseline" --alternate > "$OUT/run.log" 2>&1
echo "gpu-ab rc=$?"
MODMOE_SM90_TILE_PLAIN=128x128 timeout 60 scripts/gpu-kernels qwen3.5-35b-a3b fp8-block 8192 \
  > "$OUT/kernels-128x128-qwen35-fp8-8192.txt" 2>&1
tail -n 8 "$OUT/kernels-128x128-qwen35-fp8-8192.txt"
grep -E "^(model|whole|[a-z0-9.-]+ +(none|fp8-block))" "$OUT/ab.txt" | head -20
