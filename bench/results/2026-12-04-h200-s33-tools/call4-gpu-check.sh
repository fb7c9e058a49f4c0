#!/usr/bin/env bash
# Thirty-third session, call 4: gpu-check of the working tree (7a88999's programmatic weighted
# reduce with plain src loads; the new ProgrammaticReduce test in the memcheck set too).
set -u
cd "$(dirname "$0")/../../.."  # the repository root
MODMOE_GPU_CHECK_BUDGET=420 \
MODMOE_MEMCHECK_FILTER='Sm90GemmUnaligned.*:CudaPairs/GraphCapture.*:Cases/DecodeMlp.*:CudaQuant.*:CudaReduce.*:CudaBatched.*:Routes/Sm90ExpertsQuantizeInput.*:CudaPermutePaths.*:CudaFastActivation.*:Sm90Programmatic.*:ProgrammaticReduce.*' \
MODMOE_RACECHECK_FILTER='Cases/DecodeMlp.*:Routes/Sm90ExpertsQuantizeInput.*:CudaPermutePaths.SingleBlock*:CudaPermutePaths.Automatic*:Sm90GemmUnaligned.Bf16Swapped*' \
  bash scripts/gpu-check --steps build,tests,check,bench,memcheck,racecheck > "$OUT/gpu-check-stdout.log" 2>&1
echo "gpu-check rc=$?"
tail -45 "$OUT/gpu-check-stdout.log"
