#!/usr/bin/env bash
# PREPARED (not run in the thirty-first session): a bound for larger TMA-store pieces
# (perf.md thirty-first session §6). The study patch
# (…-s31-patches/study-tma-store-one-fence-per-half.patch; outputs wrong, --no-check) gives each
# consumer half (two 16 x 64 pieces per warp) one read wait, one fence and one commit, the pieces
# written over each other in the 2 KB buffer: the timing of 4 KB of staging per warp (which the
# real thing would take from a fourth stage), against HEAD. If GEMM2 at Qwen3 / Qwen3.5 fp8
# M = 8192 drops by more than ~10 us, build it (short-K plain GEMMs: a 3-stage ring with the
# fourth stage as staging). Here first: `scripts/gpu-ab prepare HEAD`; carry .deps and .ab-base.
# ~4 minutes.
set -u
cd "$(dirname "$0")/../../.."  # the repository root
P=bench/results/2026-12-04-h200-s31-patches/study-tma-store-one-fence-per-half.patch
scripts/gpu-ab run --patch "$P" \
  --bench "--shapes standard --models qwen3-30b-a3b,qwen3.5-35b-a3b,deepseek-v3 --ms 8192 --no-baseline --no-check" \
  --alternate > "$OUT/run.log" 2>&1
echo "gpu-ab run rc=$?"
scripts/gpu-ab kernels qwen3.5-35b-a3b fp8-block 8192 >> "$OUT/run.log" 2>&1
grep -E "^(model|whole|[a-z0-9.-]+ +(fp8-block|none))" "$OUT/ab.txt" | head -20
for f in "$OUT"/kernels-*.txt; do echo "== $f"; sed -n 3,9p "$f"; done
