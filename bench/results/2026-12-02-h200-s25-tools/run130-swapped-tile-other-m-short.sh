#!/usr/bin/env bash
# Session 25, call 6 (~2 minutes, carry .deps): Mixtral bf16 M = 512 / 1024 / 2048, the
# heuristic's GEMM2 tiles (base: 128x128, the swapped 144x256, 128x256) against
# MODMOE_SM90_TILE_PLAIN=64x256 (cand), one binary, base, cand, cand, base; each run's JSON and
# the two comparisons under $OUT.
set -u
cd "$(dirname "$0")/../../.."
scripts/gpu-build modmoe-bench > "$OUT/build.log" 2>&1 || { echo "build failed"; tail -5 "$OUT/build.log"; exit 1; }
bench=build-gpu/tools/modmoe-bench
args=(--shapes standard --models mixtral-8x7b --quants none --ms 512,1024,2048 --no-baseline)
$bench "${args[@]}" --json "$OUT/base1.json" > /dev/null 2>&1
MODMOE_SM90_TILE_PLAIN=64x256 $bench "${args[@]}" --json "$OUT/cand1.json" > /dev/null 2>&1
MODMOE_SM90_TILE_PLAIN=64x256 $bench "${args[@]}" --json "$OUT/cand2.json" > /dev/null 2>&1
$bench "${args[@]}" --json "$OUT/base2.json" > /dev/null 2>&1
python3 bench/ab_compare.py "$OUT/base1.json" "$OUT/cand1.json" 2>&1 | grep -E "^(model|mixtral|whole)"
python3 bench/ab_compare.py "$OUT/base2.json" "$OUT/cand2.json" 2>&1 | grep -E "^(model|mixtral|whole)"
