#!/usr/bin/env bash
# Thirty-third session, call 6: memcheck over the BatchedSm90Experts pairs after aa0afd3 (their
# GEMM2 now a programmatic launch at <= 16 rows per expert), the graph-capture cases and both
# programmatic tests. The rest of gpu-check ran in call 4 (7a88999).
set -u
cd "$(dirname "$0")/../../.."  # the repository root
MODMOE_GPU_CHECK_BUDGET=250 \
MODMOE_MEMCHECK_FILTER='AllPairs/CudaCombinations.*Batched_BatchedSm90*:CudaPairs/GraphCapture.*:Sm90Programmatic.*:ProgrammaticReduce.*' \
  bash scripts/gpu-check --steps build,memcheck > "$OUT/gpu-check-stdout.log" 2>&1
echo "gpu-check rc=$?"
tail -6 "$OUT/gpu-check-stdout.log"
