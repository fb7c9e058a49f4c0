#!/usr/bin/env bash
# Prepared in session 21 for a later one (never run on a GPU): where the decode path's `down`
# spends its time at M = 1 — gpt-oss fp8 (180 CTAs on 132 SMs, 45 % of the DRAM peak in the
# sixteenth session) and Qwen3 bf16 (128 CTAs of 16 warps) — and gate_up of Qwen3 bf16 under
# the new 8-warp shape. One forward each under ncu (--set full, caches flushed as ncu does), the
# kernels' details pages, and their hottest SASS with stall reasons (bench/ncu_source.py).
# Run in place on the GPU machine (carry .deps); ~5 minutes.
set -u
cd "$(dirname "$0")/../../.."
export PATH="$PATH:/usr/local/cuda/bin"
t0=$(date +%s)
scripts/gpu-build modmoe-profile modmoe-bench > "$OUT/build.log" 2>&1
echo "build rc=$? at $(( $(date +%s) - t0 )) s"
profile() {  # name model-args quant kernel-regex
  local name=$1 args=$2 quant=$3 regex=$4
  ncu --clock-control none --kernel-name-base demangled -k "regex:$regex" --set full \
    --import-source no -o "/tmp/$name" build-gpu/tools/modmoe-profile --pf-type NoEPPrepareAndFinalize \
    --experts-type auto --device cuda -m 1 $args --activation silu --quant "$quant" --warmup 0 \
    > "/tmp/$name.log" 2>&1 || { echo "ncu $name rc=$?"; tail -5 "/tmp/$name.log"; return; }
  ncu -i "/tmp/$name.ncu-rep" --page details > "$OUT/$name-details.txt" 2>&1
  ncu -i "/tmp/$name.ncu-rep" --page source --print-source sass --csv > "/tmp/$name-source.csv" 2>&1
  python3 bench/ncu_source.py "/tmp/$name-source.csv" --top 40 -l 0 > "$OUT/$name-sass.txt" 2>&1
  echo "== $name at $(( $(date +%s) - t0 )) s"
  grep -E "Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Block Size|Grid Size" "$OUT/$name-details.txt" | head -8
  head -3 "$OUT/$name-sass.txt"
}
gptoss="-k 2880 -n 2880 --num-experts 128 --topk 4"
qwen3="-k 2048 -n 768 --num-experts 128 --topk 8"
profile gptoss-fp8-down "$gptoss" fp8-block decode_down_kernel
profile qwen3-bf16-down "$qwen3" none decode_down_kernel
profile qwen3-bf16-gate-up "$qwen3" none decode_gate_up_kernel
