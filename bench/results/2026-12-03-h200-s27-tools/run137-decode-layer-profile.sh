#!/usr/bin/env bash
# Session 27, call 3: why the persistent decode layer is slower (call 2: 1.31x at gpt-oss fp8
# M = 1). Each kernel alone under ncu for both settings, then the layer kernel's stall and memory
# sections (gpt-oss-120b fp8 M = 1).
set -u
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
scripts/gpu-build --build build-gpu --jobs 16 modmoe-bench modmoe-profile > "$OUT/build.log" 2>&1
echo "build rc=$? $(( $(date +%s) - t0 )) s"
for L in 0 1; do
  MODMOE_DECODE_LAYER=$L scripts/gpu-kernels gpt-oss-120b fp8-block 1 > "$OUT/kernels-gpt-oss-fp8-1-layer$L.txt" 2>&1
  MODMOE_DECODE_LAYER=$L scripts/gpu-kernels qwen3.5-35b-a3b fp8-block 1 > "$OUT/kernels-qwen3.5-fp8-1-layer$L.txt" 2>&1
done
MODMOE_DECODE_LAYER=1 scripts/gpu-kernels deepseek-v3 fp8-block 1 > "$OUT/kernels-deepseek-fp8-1-layer1.txt" 2>&1
cat "$OUT"/kernels-*.txt
MODMOE_DECODE_LAYER=1 timeout 200 ncu --clock-control none -k regex:decode_layer \
  --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis \
  --section Occupancy --section LaunchStats --section SchedulerStats \
  build-gpu/tools/modmoe-profile --pf-type NoEPPrepareAndFinalize --experts-type auto --device cuda \
  -m 1 -k 2880 -n 2880 --num-experts 128 --topk 4 --activation swigluoai --quant fp8-block --warmup 0 \
  > "$OUT/ncu-layer-gpt-oss.txt" 2>&1
grep -E "Duration|DRAM Throughput|Memory Throughput|Stall|Warp Cycles|Eligible|Issued Warp|Achieved Occupancy|Registers|Shared Memory Config|L2 Hit|L1/TEX Hit|Block Limit|No Eligible|One or More" "$OUT/ncu-layer-gpt-oss.txt" | head -50
echo "total $(( $(date +%s) - t0 )) s"
