#!/usr/bin/env bash
# Session 24, call 4: the ping-pong tile's sparse epilogue (the working tree) against HEAD
# (.ab-base: `scripts/gpu-ab prepare HEAD` here; carry .deps and .ab-base). The Hopper GEMM and
# experts tests first (with the new bit-for-bit test against the unrolled epilogue; a failure
# stops it), then M = 16 and 128 of the standard models, alternated (two rounds). If both rounds'
# median is <= 1.000: scripts/gpu-check of the candidate in the same call (into $OUT/check).
# Predicted: Qwen3 / Qwen3.5 fp8 M = 16 3-5 us faster (GEMM1's first epilogue no longer holds
# back the CTA's third tile; GEMM2's 1-2 us), M = 128 0-2 %, bf16 (GEMM2 only) 0-1 %.
set -u
cd "$(dirname "$0")/../../.."
start=$(date +%s)
scripts/gpu-ab run \
  --tests 'Sm90GemmUnaligned.*:Routes/Sm90ExpertsQuantizeInput.*:*GraphCapture*:Sm90MoeGemm*:Sm90Experts*' \
  --bench "--shapes standard --ms 16,128 --no-baseline" --alternate > "$OUT/run.log" 2>&1
rc=$?
elapsed=$(( $(date +%s) - start ))
echo "gpu-ab rc=$rc after $elapsed s"
grep -E "^(gpu-ab: cand|\[  (PASSED|FAILED)|model|whole|[a-z0-9.-]+ +(none|fp8-block))" "$OUT/ab.txt" | head -70
medians=$(grep "whole layer" "$OUT/ab.txt" | sed -E 's/.*median ([0-9.]+).*/\1/' | tr '\n' ' ')
echo "medians: $medians"
ok=$(python3 -c "import sys; m=[float(x) for x in '$medians'.split()]; print(int(len(m) == 2 and max(m) <= 1.0))")
if [ "$rc" -eq 0 ] && [ "$ok" -eq 1 ]; then
  mkdir -p "$OUT/check"
  OUT="$OUT/check" MODMOE_GPU_CHECK_BUDGET=$(( 575 - elapsed )) \
    MODMOE_MEMCHECK_FILTER='Sm90GemmUnaligned.*:CudaPairs/GraphCapture.*:Cases/DecodeMlp.*:CudaQuant.*:CudaReduce.*:CudaBatched.*:Routes/Sm90ExpertsQuantizeInput.*:CudaPermutePaths.*' \
    MODMOE_RACECHECK_FILTER='Cases/DecodeMlp.*:Routes/Sm90ExpertsQuantizeInput.*:CudaPermutePaths.SingleBlock*:CudaPermutePaths.Automatic*:Sm90GemmUnaligned.Sparse*' \
    bash scripts/gpu-check --steps build,tests,check,bench,memcheck,racecheck > /dev/null 2>&1
  echo "gpu-check rc=$?"
  rm -f "$OUT/check/logs.tar.gz"  # at most 8 files come back
  tail -25 "$OUT/check/summary.txt" 2>/dev/null
fi
