#!/usr/bin/env bash
# PREPARED (not run in the thirty-first session): the consumer phase trace of call 7 plus the
# epilogue's parts (…-s31-patches/gemm-consumer-phase-trace-epilogue-parts.patch, on 5615950's
# sources): for thread 0's warp, the TMA-store epilogue's read waits / staging stores / fence and
# issue (GEMM2), and the gated epilogue's activation / amax and scales / conversion and stores
# (GEMM1), as shares of the epilogue, printed under each gemm_trace line. What GEMM2's 26 % at
# Qwen3.5 fp8 M = 8192 is made of (perf.md thirty-first session §1, §4). One forward after two
# warm-ups per case through modmoe-profile; only the patched tree is built. ~2 minutes.
set -u
cd "$(dirname "$0")/../../.."  # the repository root
git apply bench/results/2026-12-04-h200-s31-patches/gemm-consumer-phase-trace-epilogue-parts.patch || exit 1
scripts/gpu-build --build build-gpu modmoe-profile > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
profile=build-gpu/tools/modmoe-profile
for spec in "qwen3.5-35b-a3b fp8-block 8192 256 8 2048 512 silu" \
            "qwen3.5-35b-a3b fp8-block 16 256 8 2048 512 silu" \
            "qwen3-30b-a3b fp8-block 8192 128 8 2048 768 silu" \
            "deepseek-v3 fp8-block 8192 256 8 7168 2048 silu"; do
  set -- $spec
  MODMOE_GEMM_TRACE=1 timeout 120 $profile --pf-type NoEPPrepareAndFinalize --experts-type auto \
    --device cuda -m "$3" -k "$6" -n "$7" --num-experts "$4" --topk "$5" --activation "$8" \
    --quant "$2" --warmup 2 > /dev/null 2> "$OUT/trace-$1-$2-$3.txt"
  echo "== $1 $2 M=$3 (rc=$?): the traced forward's GEMMs"
  grep gemm_trace "$OUT/trace-$1-$2-$3.txt" | tail -4
done
