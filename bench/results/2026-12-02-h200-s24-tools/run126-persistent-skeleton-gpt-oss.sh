#!/usr/bin/env bash
# Session 24, call 6: persistent_skeleton.cu for gpt-oss-120b fp8 at M = 1 (w13 4 x 5760 x 2880,
# w2 4 x 2880 x 2880 bytes), then Qwen3-30B-A3B bf16 again (call 5's sizes: the repeat). The
# layers' own times are the gpu-check's (call 3: gpt-oss fp8 M = 1 41.1 us, read-only 26.6 us);
# the skeleton's read-only line calibrates this run against it. ~2 minutes.
set -u
cd "$(dirname "$0")"
export PATH="$PATH:/usr/local/cuda/bin"
nvcc -O3 -arch=sm_90a -std=c++17 -o /tmp/persistent_skeleton persistent_skeleton.cu > "$OUT/skeleton-build.log" 2>&1 ||
  { echo "skeleton build failed"; tail -20 "$OUT/skeleton-build.log"; exit 1; }
{ echo "== gpt-oss-120b fp8, M = 1"; /tmp/persistent_skeleton 66355200 33177600
  echo "== qwen3-30b-a3b bf16, M = 1 (repeat of call 5)"; /tmp/persistent_skeleton; } > "$OUT/skeleton.txt" 2>&1
echo "skeleton rc=$?"
cat "$OUT/skeleton.txt"
