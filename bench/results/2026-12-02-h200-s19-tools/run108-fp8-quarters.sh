#!/usr/bin/env bash
# Prepared in session 19 for a later one (never run on a GPU): s19-patches/fp8-quarters-pipelined-promotion.patch
# (the 64x256 fp8 consumers -- the 128x256 and 64x256 fp8 kernels -- run each K block as four n = 64
# quarters into two alternating product buffers: one quarter's wgmmas run while the previous one is
# promoted). Compiled here with nvcc 13.0 -Xptxas -v: no C7514 (wgmma serialization) warning, no spills
# (the 64x256 fp8 kernel's 8-byte spill gone). On the GPU: the patch, both builds, the fp8 GEMM suites on
# every tile, then an alternated A/B of the fp8 layers against .ab-base. Here first:
# `scripts/gpu-ab prepare HEAD`; then run this file on the GPU machine (carry .deps and .ab-base), and
# the gpu-check in a second call if the M = 8192 fp8 layers gain.
set -u
cd "$(dirname "$0")/../../.."
scripts/gpu-ab run --patch bench/results/2026-12-02-h200-s19-patches/fp8-quarters-pipelined-promotion.patch \
  --tests '*Sm90MoeGemm*:Sm90GemmUnaligned.*:*Sm90Experts*:*GraphCapture*' \
  --alternate --bench "--shapes standard --ms 16,1024,8192 --quants fp8-block --no-baseline --settle-ms 30"
