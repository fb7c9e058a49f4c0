#!/usr/bin/env bash
# Session 31: gpu-check of HEAD (the fp8 128x128 paired loop and the fp8-out quad-transposed
# stores, both new since the thirtieth session's check).
set -u
cd "$(dirname "$0")/../../.."  # the repository root
MODMOE_GPU_CHECK_BUDGET=450 \
MODMOE_MEMCHECK_FILTER='Sm90GemmUnaligned.*:CudaPairs/GraphCapture.*:Cases/DecodeMlp.*:CudaQuant.*:CudaReduce.*:CudaBatched.*:Routes/Sm90ExpertsQuantizeInput.*:CudaPermutePaths.*:CudaFastActivation.*' \
MODMOE_RACECHECK_FILTER='Cases/DecodeMlp.*:Routes/Sm90ExpertsQuantizeInput.*:CudaPermutePaths.SingleBlock*:CudaPermutePaths.Automatic*:Sm90GemmUnaligned.Bf16Swapped*' \
  bash scripts/gpu-check --steps build,tests,check,bench,memcheck,racecheck > "$OUT/gpu-check-stdout.log" 2>&1
echo "gpu-check rc=$?"
tail -45 "$OUT/gpu-check-stdout.log"
