#!/usr/bin/env bash
# Session 28, call 1: where the persistent decode layer loses its time. With the diagnosis patch
# (…-s28-patches/layer-phase-trace.patch: per-CTA %globaltimer stamps at the phase boundaries,
# printed after each launch when MODMOE_LAYER_TRACE is set), one forward after 3 warm-ups of
# four M = 1 layers with MODMOE_DECODE_LAYER=1; then ncu's warp-state, scheduler and memory
# sections for the layer kernel and for the separate kernels (gpt-oss-120b fp8 M = 1).
set -u
cd "$(dirname "$0")/../../.."
git apply bench/results/2026-12-04-h200-s28-patches/layer-phase-trace.patch || exit 1
t0=$(date +%s)
scripts/gpu-build --build build-gpu --jobs 16 modmoe-profile modmoe-bench > "$OUT/build.log" 2>&1
echo "build rc=$? $(( $(date +%s) - t0 )) s"
profile=build-gpu/tools/modmoe-profile
run() {  # MODEL QUANT E topk K N act [extra env...]
  local model=$1 quant=$2 E=$3 topk=$4 K=$5 N=$6 act=$7
  shift 7
  env "$@" $profile --pf-type NoEPPrepareAndFinalize --experts-type auto --device cuda -m 1 \
    -k "$K" -n "$N" --num-experts "$E" --topk "$topk" --activation "$act" --quant "$quant" \
    --warmup 3
}
for spec in "gpt-oss-120b fp8-block 128 4 2880 2880 swigluoai" \
            "gpt-oss-120b none 128 4 2880 2880 swigluoai" \
            "qwen3.5-35b-a3b fp8-block 256 8 2048 512 silu" \
            "deepseek-v3 fp8-block 256 8 7168 2048 silu"; do
  set -- $spec
  echo "== $1 $2 M=1"
  run "$@" MODMOE_DECODE_LAYER=1 MODMOE_LAYER_TRACE=1 > "$OUT/trace-$1-$2.out" 2> "$OUT/trace-$1-$2.txt"
  echo "rc=$?"
  tail -16 "$OUT/trace-$1-$2.txt"
done
export PATH="$PATH:/usr/local/cuda/bin"
sections="--section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis"
sections+=" --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio"
for layer in 1 0; do
  timeout 150 env MODMOE_DECODE_LAYER=$layer ncu --clock-control none $sections -k regex:decode \
    $profile --pf-type NoEPPrepareAndFinalize --experts-type auto --device cuda -m 1 -k 2880 \
    -n 2880 --num-experts 128 --topk 4 --activation swigluoai --quant fp8-block --warmup 0 \
    > "$OUT/ncu-gpt-oss-fp8-1-layer$layer.txt" 2>&1
  echo "ncu layer=$layer rc=$?"
  grep -E "^  [a-z_]+kernel|Duration|Issued Warp|No Eligible|Active Warps Per|Eligible Warps|Warp Cycles Per Issued|Achieved Occupancy|Registers Per|Block Size|Grid Size|Memory Throughput|L2 Hit" "$OUT/ncu-gpt-oss-fp8-1-layer$layer.txt" | head -60
  awk '/^  [a-z_]+kernel/ {print} /issue_stalled/ && $NF+0 > 0.2 {print "   ", $1, $NF}' "$OUT/ncu-gpt-oss-fp8-1-layer$layer.txt" | head -60
done
echo "total $(( $(date +%s) - t0 )) s"
