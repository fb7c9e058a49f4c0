#!/usr/bin/env bash
# Session 29 call 3: gpu-check of e692e76 (the tanh sigmoid), then the Hopper GEMMs' pipes at
# Qwen3.5 fp8 M = 8192 under ncu (what bounds GEMM1 / GEMM2 now).
set -u
cd "$(dirname "$0")/../../.."  # the repository root (as run: from build-run/, one level up)
MODMOE_GPU_CHECK_BUDGET=470 \
MODMOE_MEMCHECK_FILTER='Sm90GemmUnaligned.*:CudaPairs/GraphCapture.*:Cases/DecodeMlp.*:CudaQuant.*:CudaReduce.*:CudaBatched.*:Routes/Sm90ExpertsQuantizeInput.*:CudaPermutePaths.*:CudaFastActivation.*' \
MODMOE_RACECHECK_FILTER='Cases/DecodeMlp.*:Routes/Sm90ExpertsQuantizeInput.*:CudaPermutePaths.SingleBlock*:CudaPermutePaths.Automatic*:Sm90GemmUnaligned.Bf16Swapped*' \
  bash scripts/gpu-check --steps build,tests,check,bench,memcheck,racecheck > "$OUT/gpu-check-stdout.log" 2>&1
echo "gpu-check rc=$?"
tail -45 "$OUT/gpu-check-stdout.log"
export PATH="$PATH:/usr/local/cuda/bin"
m=sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active
m+=,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active
m+=,sm__issue_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum
m+=,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active
m+=,sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active
timeout 100 ncu --clock-control none --kernel-name grouped_gemm_kernel --metrics "$m" \
  build-gpu/tools/modmoe-profile --pf-type NoEPPrepareAndFinalize --experts-type auto --device cuda \
  -m 8192 -k 2048 -n 512 --num-experts 256 --topk 8 --activation silu --quant fp8-block \
  --warmup 0 > "$OUT/ncu-pipes.txt" 2>&1
echo "ncu rc=$?"
grep -E "grouped_gemm_kernel|pipe|issue_active|duration|ERROR|rror" "$OUT/ncu-pipes.txt" | head -30
