#!/usr/bin/env bash
# Session 25, call 6: the swapped 144x256 tile outside the standard M values. Mixtral bf16 at
# M = 512 (~128 rows per expert: the heuristic picks 144x256 for GEMM2, one wave), 1024 (144x256)
# and 2048 (~512 rows: 64x256 by the model, so an A/A there), the heuristic's tiles (base)
# against MODMOE_SM90_TILE_PLAIN=64x256 (candidate), one binary, alternated. ~4 minutes.
set -u
cd "$(dirname "$0")/../../.."
scripts/gpu-build modmoe-bench > "$OUT/build.log" 2>&1 || { echo "build failed"; tail -20 "$OUT/build.log"; exit 1; }
scripts/gpu-ab env "MODMOE_SM90_TILE_PLAIN=64x256" \
  --bench "--shapes standard --models mixtral-8x7b --quants none --ms 512,1024,2048 --no-baseline" \
  --alternate > "$OUT/run.log" 2>&1
echo "gpu-ab rc=$?"
grep -E "^(model|whole|mixtral)" "$OUT/ab.txt" | head -20
