#!/usr/bin/env bash
# Session 24, call 5: persistent_skeleton.cu (the byte stream of a persistent decode layer for
# Qwen3-30B-A3B bf16 M = 1, no math: see its header), and in the same run the layer itself
# (modmoe-bench, Qwen3 at M = 1, both dtypes) for comparison. Carry .deps. ~3 minutes.
set -u
cd "$(dirname "$0")"
export PATH="$PATH:/usr/local/cuda/bin"
nvcc -O3 -arch=sm_90a -std=c++17 -o /tmp/persistent_skeleton persistent_skeleton.cu > "$OUT/skeleton-build.log" 2>&1 ||
  { echo "skeleton build failed"; tail -20 "$OUT/skeleton-build.log"; exit 1; }
/tmp/persistent_skeleton > "$OUT/skeleton.txt" 2>&1
echo "skeleton rc=$?"
cat "$OUT/skeleton.txt"
cd ../../..
scripts/gpu-build modmoe-bench > "$OUT/build.log" 2>&1 || { echo "bench build failed"; tail -20 "$OUT/build.log"; exit 1; }
build-gpu/tools/modmoe-bench --shapes standard --models qwen3-30b-a3b --ms 1 --no-baseline \
  > "$OUT/bench.txt" 2>&1
echo "bench rc=$?"
grep -E "ceilings|qwen3|graph launch" "$OUT/bench.txt" | head -12
