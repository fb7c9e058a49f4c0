#!/usr/bin/env bash
# Thirty-third session, call 5: BatchedSm90Experts (expert-parallel decode) launches GEMM2 after
# GEMM1 programmatically when its batch holds at most 16 rows per expert (the working tree),
# against 7ca70a7 (modmoe-bench able to run a batched --pf). Predicted: 1-3 us off the M = 1 / 16
# layers (GEMM2's weight stream starts under GEMM1's tail, as in Sm90Experts), nothing else.
set -u
cd "$(dirname "$0")/../../.."  # the repository root
scripts/gpu-ab run --tests '*Programmatic*:*Batched*:*Combinations*' \
  --bench "--shapes standard --pf BatchedPrepareAndFinalize --experts BatchedSm90Experts --ms 1,16 --quants fp8-block,none --no-baseline" \
  --alternate > "$OUT/run.log" 2>&1
echo "gpu-ab run rc=$?"
grep -E "^(gpu-ab: cand|\[  (PASSED|FAILED)|model|whole|[a-z0-9.-]+ +(none|fp8-block))|FAILED|Failure|rror" "$OUT/ab.txt" | head -50
