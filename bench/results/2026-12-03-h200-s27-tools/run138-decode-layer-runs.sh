#!/usr/bin/env bash
# Session 27, call 4: the persistent decode layer with one run of stages per warp (143d862):
# run136 again (tests, memcheck, racecheck, the A/B at M = 1, 4, 8), then its kernel alone
# under ncu for gpt-oss-120b fp8 M = 1 and DeepSeek-V3 fp8 M = 1.
set -u
cd "$(dirname "$0")/../../.."
bash bench/results/2026-12-03-h200-s27-tools/run136-decode-layer.sh
scripts/gpu-build --build build-gpu --jobs 16 modmoe-profile > "$OUT/build-profile.log" 2>&1
for m in gpt-oss-120b deepseek-v3; do
  MODMOE_DECODE_LAYER=1 scripts/gpu-kernels $m fp8-block 1 > "$OUT/kernels-$m-fp8-1-layer1.txt" 2>&1
  cat "$OUT/kernels-$m-fp8-1-layer1.txt"
done
