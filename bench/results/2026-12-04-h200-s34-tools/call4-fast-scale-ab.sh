#!/usr/bin/env bash
# Thirty-fourth session, call 4: the Hopper GEMM's fp8-out epilogue computing both rows' scales
# and reciprocals branch-free (fp8_codec.cuh: fp8_scale_for_amax_fast, fp8_reciprocal_fast)
# where both amaxes allow it (the working tree against HEAD). First the exhaustive bit check on
# every amax (CudaFp8Codec.*), then the Hopper GEMM / experts tests, then the fp8 layers on the
# Hopper path, alternated. Predicted (thirty-first session's Next): ~1 % off the fp8 prefill
# GEMM1s (Qwen3.5 fp8 M = 8192 layer ~0.995), M = 16-128 within +-1 %.
set -u
cd "$(dirname "$0")/../../.."  # the repository root
scripts/gpu-ab run \
  --tests 'CudaFp8Codec.*:*Sm90*:CudaPairs/GraphCapture.*' \
  --bench "--shapes standard --quants fp8-block --ms 16,128,1024,8192 --no-baseline" \
  --alternate > "$OUT/run.log" 2>&1
echo "gpu-ab run rc=$?"
grep -E "^(gpu-ab: cand|\[  (PASSED|FAILED)|model|whole|[a-z0-9.-]+ +(none|fp8-block))|FAILED|Failure|CudaFp8Codec" "$OUT/ab.txt" | head -60
