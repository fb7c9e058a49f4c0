#!/usr/bin/env bash
# Session 19, call 2: which tile the 128-row prefill GEMMs should have. One build with the
# env knobs of s19-patches/tile-knobs-experiment.patch; alternated A/Bs of the heuristic's tiles
# (no env) against each variant at M = 1024 / 8192, then ncu kernel lists of Qwen3.5 fp8 M = 8192.
set -u
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/cuda/bin"
t0=$(date +%s)
S=$OUT/call.txt
git apply bench/results/2026-12-02-h200-s19-patches/tile-knobs-experiment.patch || { echo "patch failed"; exit 1; }
env CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++ cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DMODMOE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ > /tmp/cfg.log 2>&1
cmake --build build-gpu -j 16 --target modmoe-bench modmoe-profile > /tmp/build.log 2>&1
echo "build rc=$? at $(( $(date +%s) - t0 )) s" | tee -a $S; grep -m3 -A3 error /tmp/build.log
B=$PWD/build-gpu/tools/modmoe-bench
mkw() { printf '#!/bin/sh\n%s exec %s "$@"\n' "$2" "$B" > /tmp/$1; chmod +x /tmp/$1; }
mkw plain64x256 "MODMOE_X_TILE_PLAIN=64x256"
mkw gated64x256 "MODMOE_X_TILE_GATED=64x256"
mkw plain128x128 "MODMOE_X_TILE_PLAIN=128x128"
mkw both64x256 "MODMOE_X_TILE_PLAIN=64x256 MODMOE_X_TILE_GATED=64x256"
for v in plain64x256 gated64x256 plain128x128 both64x256; do
  rm -rf /tmp/ab; mkdir -p /tmp/ab
  OUT=/tmp/ab timeout 150 scripts/gpu-ab time $B /tmp/$v --alternate --bench "--shapes standard --ms 1024,8192 --no-baseline --settle-ms 30" > /tmp/ab-$v.log 2>&1
  echo "A/B $v rc=$? at $(( $(date +%s) - t0 )) s" | tee -a $S
  { echo "######## variant $v (base = the heuristic's tiles, same binary)"; cat /tmp/ab/ab.txt; } >> $OUT/ab-all.txt
done
for v in none plain64x256; do
  [ $(( $(date +%s) - t0 )) -lt 480 ] || break
  if [ $v = none ]; then e=""; else e="MODMOE_X_TILE_PLAIN=64x256"; fi
  env $e timeout 90 scripts/gpu-kernels qwen3.5-35b-a3b fp8-block 8192 > /tmp/k-$v.txt 2>&1
  { echo "######## gpu-kernels qwen3.5 fp8 8192, variant $v"; cat /tmp/k-$v.txt; } >> $OUT/kernels.txt
done
echo "done at $(( $(date +%s) - t0 )) s" | tee -a $S
grep -E "^(######|model|whole)|  (1024|8192) " $OUT/ab-all.txt | head -120
tail -30 $OUT/kernels.txt
