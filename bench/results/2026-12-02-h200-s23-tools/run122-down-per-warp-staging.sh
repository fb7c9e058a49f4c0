#!/usr/bin/env bash
# Prepared in session 23 for a later one (never run on a GPU): the decode `down` whose warps each
# stage only their own units' h slices and folds (`…-s23-patches/decode-down-per-warp-staging.patch`),
# so no block-wide staging and no __syncthreads stand between the wait for gate_up and a warp's
# first MMA. Session 23's calls 1-3 (docs/perf.md) found the bf16 Qwen layers at M = 1 2-6 %
# slower whenever that stretch got longer. ptxas (nvcc 13.0): no spills, sm_90a 90 (bf16) / 99
# (fp8) registers (were 104 / 90), sm_80 77 / 80.
# Predicted: Qwen3 / Qwen3.5 bf16 M = 1 0.5-1.5 us faster; the other decode cases within +-2 %.
# Correctness: the Cases/DecodeMlp suite (partial groups, expert_map, many pairs per expert,
# large shared operands) against the oracle; memcheck and racecheck over it.
# Here first: `scripts/gpu-ab prepare HEAD`; carry .deps and .ab-base. ~5 minutes.
set -u
cd "$(dirname "$0")"
bash decode-patch-ab.sh bench/results/2026-12-02-h200-s23-patches/decode-down-per-warp-staging.patch
