#!/usr/bin/env bash
# PREPARED for the next session (not run in the thirtieth): where the Hopper GEMM consumers'
# cycles go. With the diagnosis patch (…-s30-patches/gemm-consumer-phase-trace.patch: thread 0 of
# each consumer warpgroup adds the SM clock cycles of each phase — tile start, the fp8 by-halves
# loop's stage waits / wgmma waits / the rest of its loop, the epilogue — printed per launch when
# MODMOE_GEMM_TRACE=1), one forward after two warm-ups of each case through modmoe-profile (not
# in a graph: the print synchronizes the host); then the patch's cost on the kernels themselves
# (gpu-ab against HEAD with the patch, ncu kernel lists), so the trace's shares can be read
# against an unperturbed kernel. Here first: `scripts/gpu-ab prepare HEAD`; carry .deps and
# .ab-base. ~5 minutes.
set -u
cd "$(dirname "$0")/../../.."  # the repository root
P=bench/results/2026-12-04-h200-s30-patches/gemm-consumer-phase-trace.patch
scripts/gpu-ab run --patch "$P" --bench "--shapes standard --models qwen3.5-35b-a3b --ms 1024,8192 --quants fp8-block --no-baseline" \
  > "$OUT/run.log" 2>&1
echo "gpu-ab rc=$?"
scripts/gpu-ab kernels qwen3.5-35b-a3b fp8-block 8192 > /dev/null 2>&1  # builds modmoe-profile too
profile=build-gpu/tools/modmoe-profile
for spec in "qwen3.5-35b-a3b fp8-block 8192 256 8 2048 512 silu" \
            "qwen3.5-35b-a3b fp8-block 1024 256 8 2048 512 silu" \
            "qwen3.5-35b-a3b fp8-block 16 256 8 2048 512 silu" \
            "deepseek-v3 fp8-block 8192 256 8 7168 2048 silu" \
            "mixtral-8x7b fp8-block 1024 8 2 4096 14336 silu" \
            "mixtral-8x7b none 1024 8 2 4096 14336 silu"; do
  set -- $spec
  MODMOE_GEMM_TRACE=1 timeout 120 $profile --pf-type NoEPPrepareAndFinalize --experts-type auto \
    --device cuda -m "$3" -k "$6" -n "$7" --num-experts "$4" --topk "$5" --activation "$8" \
    --quant "$2" --warmup 2 > /dev/null 2> "$OUT/trace-$1-$2-$3.txt"
  echo "== $1 $2 M=$3 (rc=$?): the traced forward's GEMMs"
  grep gemm_trace "$OUT/trace-$1-$2-$3.txt" | tail -2
done
grep -E "^(model|whole|[a-z0-9.-]+ +fp8-block)" "$OUT/ab.txt" | head -8
for f in "$OUT"/kernels-*.txt; do echo "== $f"; sed -n 3,9p "$f"; done
