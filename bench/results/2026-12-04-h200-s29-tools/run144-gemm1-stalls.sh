#!/usr/bin/env bash
# Session 29 call 4: what bounds the Hopper GEMMs at Qwen3.5 fp8 M = 8192 after the tanh sigmoid
# (warp states, pipes). Uses call 3's build-gpu if present, else builds modmoe-profile.
set -u
cd "$(dirname "$0")/../../.."  # the repository root (as run: from build-run/, one level up)
export PATH="$PATH:/usr/local/cuda/bin"
if [ ! -x build-gpu/tools/modmoe-profile ]; then
  scripts/gpu-build --build build-gpu --jobs 16 modmoe-profile > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
fi
ncu --query-metrics --chip gh100 2>/dev/null | grep -iE "gmma|tensor_op_hmma|pipe_tensor" | head -12 > "$OUT/metric-names.txt"
cat "$OUT/metric-names.txt"
tm=$(grep -oE "sm__pipe_tensor_op_gmma_cycles_active[a-z_.]*|sm__pipe_[a-z_]*gmma[a-z_]*" "$OUT/metric-names.txt" | head -1)
m=${tm:+$tm.avg.pct_of_peak_sustained_active,}gpu__time_duration.sum
timeout 200 ncu --clock-control none --kernel-name grouped_gemm_kernel --section WarpStateStats \
  --section SchedulerStats --section ComputeWorkloadAnalysis --metrics "$m" \
  build-gpu/tools/modmoe-profile --pf-type NoEPPrepareAndFinalize --experts-type auto --device cuda \
  -m 8192 -k 2048 -n 512 --num-experts 256 --topk 8 --activation silu --quant fp8-block \
  --warmup 0 > "$OUT/ncu-gemms.txt" 2>&1
echo "ncu rc=$?"
grep -vE "^==PROF==|^ *-+ *$" "$OUT/ncu-gemms.txt" | grep -E "grouped_gemm|Stall|Warp Cycles|Eligible|Issued|No Eligible|Active Warps|gmma|duration|Pipe|IPC|Issue Slots|SM Busy" | head -60
