#!/usr/bin/env bash
# Prepared in session 22 for a later one (never run on a GPU): the decode `down` with twice the
# warps on each SM (`…-s22-patches/decode-down-twice-the-warps.patch`). ncu (session 22 §4):
# `down` at M = 1 is a dependency chain per warp with a quarter of the SM's warp slots
# (90-104 registers, 0.63-0.74 eligible warps per scheduler). The patch adds a second `down`
# instantiation with 32-warp launch bounds (<= 64 registers; ptxas: no spills on sm_90a/sm_80),
# 2-stage rings (the same bytes in flight per SM as 16 warps x 4 stages) and half the h staging
# loads in flight per thread, taken where the grid then runs in one wave with 32 warps per SM
# (32 x 1, 16 x 2 or 8 x 4 CTAs): Qwen3 / Qwen3.5 M = 1 (128 CTAs of 32 warps), gpt-oss M = 1
# (180 of 16, two per SM), Qwen M = 2-4, gpt-oss M = 2; DeepSeek-V3 and Mixtral keep theirs
# (shared memory). MODMOE_DECODE_DOWN_WIDE=0 turns it off.
# Predicted: 1-2 us off Qwen3 / Qwen3.5 M = 1, 1-3 us off gpt-oss fp8 M = 1; M = 2-4 +-3 %.
# Here first: `scripts/gpu-ab prepare HEAD`; carry .deps and .ab-base. ~4-5 minutes.
set -u
cd "$(dirname "$0")/../../.."
scripts/gpu-ab run --patch bench/results/2026-12-02-h200-s22-patches/decode-down-twice-the-warps.patch \
  --tests 'Cases/DecodeMlp.*:DecodeRoute*:*GraphCapture*' \
  --bench "--shapes standard --ms 1,2,3,4 --no-baseline" --alternate > "$OUT/run.log" 2>&1
echo "gpu-ab rc=$?"
grep -E "^(gpu-ab: cand|\[  (PASSED|FAILED)|model|whole|[a-z0-9.-]+ +(none|fp8-block))" "$OUT/ab.txt" |
  grep -v -E "hopper|grouped" | head -90
