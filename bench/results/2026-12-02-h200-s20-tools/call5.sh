#!/usr/bin/env bash
# Session 20, call 5: s19's review patch (store-halves-one-dispatch: one store_halves<C, kHalves>
# for the 16/32-bit outs of the plain and gated epilogues) against HEAD, with the Hopper GEMM
# suites run on the candidate first. Here before: scripts/gpu-ab prepare HEAD (carry .deps, .ab-base).
set -u
cd "$(dirname "$0")/../../.."
scripts/gpu-ab run --patch bench/results/2026-12-02-h200-s19-patches/store-halves-one-dispatch.patch \
  --tests 'Sm90GemmUnaligned.*:*Sm90MoeGemm*:*Sm90Experts*' \
  --alternate --bench "--shapes standard --ms 16,1024,8192 --no-baseline --settle-ms 30"
