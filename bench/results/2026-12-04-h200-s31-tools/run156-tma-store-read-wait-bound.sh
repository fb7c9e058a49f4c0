#!/usr/bin/env bash
# A bound, not a candidate: the TMA-store epilogue (store_tile_tma: the 128-row tiles' 16-bit
# outs, e.g. every prefill GEMM2) without its wait for the previous piece's smem read
# (…-s31-patches/study-tma-store-no-read-wait.patch: the outputs are wrong, --no-check), against
# HEAD: what double-buffered staging could save at most. Here first: `scripts/gpu-ab prepare
# HEAD`; carry .deps and .ab-base. ~3 minutes.
set -u
cd "$(dirname "$0")/../../.."  # the repository root
P=bench/results/2026-12-04-h200-s31-patches/study-tma-store-no-read-wait.patch
scripts/gpu-ab run --patch "$P" \
  --bench "--shapes standard --models qwen3.5-35b-a3b,deepseek-v3,mixtral-8x7b --ms 1024,8192 --no-baseline --no-check" \
  > "$OUT/run.log" 2>&1
echo "gpu-ab run rc=$?"
scripts/gpu-ab kernels qwen3.5-35b-a3b fp8-block 8192 >> "$OUT/run.log" 2>&1
grep -E "^(model|whole|[a-z0-9.-]+ +(fp8-block|none))" "$OUT/ab.txt" | head -20
for f in "$OUT"/kernels-*.txt; do echo "== $f"; sed -n 3,9p "$f"; done
