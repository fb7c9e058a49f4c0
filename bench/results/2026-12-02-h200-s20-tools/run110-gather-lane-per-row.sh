#!/usr/bin/env bash
# Prepared in session 20 for a later one (never run on a GPU): s20-patches/
# gemm1-gathered-rows-lane-per-row.patch (GEMM1 reads the tokens through sorted_token; the three
# copying warps' lanes each own whole rows, their sources looked up once per tile and kept in
# registers: no shared-memory load before each cp.async). Compiled here (nvcc 13.0 -Xptxas -v):
# the 64x256 fp8 kernel's 8-byte spill as at HEAD, the 128x256 fp8 kernel 8 bytes (none at HEAD),
# no other spill. On the GPU: the patch, its gather tests and the Hopper suites on the candidate,
# then an alternated A/B: base = HEAD (the copy kernels), candidate = gathered. Here first:
# `scripts/gpu-ab prepare HEAD`; run on the GPU machine with .deps and .ab-base carried.
set -u
cd "$(dirname "$0")/../../.."
scripts/gpu-ab run --patch bench/results/2026-12-02-h200-s20-patches/gemm1-gathered-rows-lane-per-row.patch \
  --tests 'Sm90GemmUnaligned.*:Sm90ExpertsGather.*:*Sm90Experts*:*GraphCapture*' \
  --alternate --bench "--shapes standard --ms 16,128,1024,8192 --no-baseline --settle-ms 30"
