#!/usr/bin/env bash
# Session 19, call 4: the gpu-check of the landed code (HEAD: bf16 gated prefill GEMMs on 64x256).
set -u
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/cuda/bin"
MODMOE_GPU_CHECK_BUDGET=560 MODMOE_MEMCHECK_FILTER='Sm90GemmUnaligned.*:CudaPairs/GraphCapture.*:Cases/DecodeMlp.*:CudaQuant.*:CudaReduce.*:CudaBatched.*:Routes/Sm90ExpertsQuantizeInput.*:CudaPermutePaths.*' MODMOE_RACECHECK_FILTER='Cases/DecodeMlp.*:Routes/Sm90ExpertsQuantizeInput.*:CudaPermutePaths.SingleBlock*:CudaPermutePaths.Automatic*' \
  bash scripts/gpu-check --steps build,tests,check,bench,memcheck,racecheck > /tmp/gpu-check.out 2>&1
echo "gpu-check rc=$?"
cp /tmp/gpu-check.out $OUT/gpu-check.out
tail -70 /tmp/gpu-check.out
