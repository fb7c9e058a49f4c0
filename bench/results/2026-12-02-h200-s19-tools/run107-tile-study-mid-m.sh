#!/usr/bin/env bash
# Prepared in session 19 for a later one (never run): the tile rules between the standard M's.
# The heuristic switches at 64 rows per expert (64-row tiles below, 128-row above for fp8 and
# plain bf16) and was measured at M = 1024 and 8192 only; chunked prefill runs 2048-4096 tokens.
# One build of HEAD, then each variant (MODMOE_SM90_TILE_GATED / _PLAIN, `scripts/gpu-ab env`)
# against the heuristic's tiles, same binary, alternated, at M = 2048 and 4096.
# Run in place on the GPU machine (carry .deps).
set -u
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
env CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++ cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DMODMOE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ > /tmp/cfg.log 2>&1
cmake --build build-gpu -j 16 --target modmoe-bench > /tmp/build.log 2>&1
echo "build rc=$? at $(( $(date +%s) - t0 )) s"; grep -m3 -A3 error /tmp/build.log
for v in MODMOE_SM90_TILE_GATED=64x256 MODMOE_SM90_TILE_GATED=128x256 MODMOE_SM90_TILE_PLAIN=64x256 MODMOE_SM90_TILE_PLAIN=128x256; do
  [ $(( $(date +%s) - t0 )) -lt 480 ] || break
  rm -rf /tmp/ab; mkdir -p /tmp/ab
  OUT=/tmp/ab timeout 120 scripts/gpu-ab env "$v" --alternate --bench "--shapes standard --ms 2048,4096 --no-baseline --settle-ms 30" > /tmp/ab.log 2>&1
  echo "A/B $v rc=$? at $(( $(date +%s) - t0 )) s"
  { echo "######## $v (base = the heuristic's tiles, same binary)"; cat /tmp/ab/ab.txt; } >> $OUT/ab-all.txt
done
grep -E "^(######|whole)" $OUT/ab-all.txt
