#!/usr/bin/env bash
# Prepared in session 20 for a later one (never run on a GPU): s20-patches/silu-ex2-ftz.patch (the
# Hopper epilogue's sigmoid through ex2.approx.ftz of x times one folded constant instead of
# __expf: 3 fewer instructions per element, 3.5 KB less code per sigmoid-based activation path,
# no spill changes; nvcc 13.0 -Xptxas -v here). On the GPU: the patch, the Hopper suites on the
# candidate first, then an alternated A/B against HEAD. Here first: `scripts/gpu-ab prepare HEAD`;
# run on the GPU machine with .deps and .ab-base carried.
set -u
cd "$(dirname "$0")/../../.."
scripts/gpu-ab run --patch bench/results/2026-12-02-h200-s20-patches/silu-ex2-ftz.patch \
  --tests 'Sm90GemmUnaligned.*:*Sm90MoeGemm*:*Sm90Experts*:*GraphCapture*' \
  --alternate --bench "--shapes standard --ms 16,128,1024,8192 --no-baseline --settle-ms 30"
