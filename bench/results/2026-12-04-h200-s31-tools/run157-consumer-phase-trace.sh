#!/usr/bin/env bash
# Where the Hopper GEMM consumers' cycles go after the fp8-out quad stores (5615950): the
# thirtieth session's trace patch rebased (…-s31-patches/gemm-consumer-phase-trace-on-5615950.patch;
# thread 0 of each consumer warpgroup adds the SM clock cycles of each phase, printed per launch
# with MODMOE_GEMM_TRACE=1), one forward after two warm-ups per case through modmoe-profile.
# Only the patched tree is built (its ~6 % perturbation was measured in call 1). ~2 minutes.
set -u
cd "$(dirname "$0")/../../.."  # the repository root
git apply bench/results/2026-12-04-h200-s31-patches/gemm-consumer-phase-trace-on-5615950.patch || exit 1
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
  grep gemm_trace "$OUT/trace-$1-$2-$3.txt" | tail -2
done
