#!/usr/bin/env bash
# Session 20, call 3: why the gathered GEMM1 (cp.async producer) ran 1.9-2.7x slower in call 2.
# One build with the announce mode as a variable (MODMOE_SM90_GATHER_MODE: 0 noinc arrive per
# stage, 1 commit groups announced kStages - 2 stages later, 2 each stage's copies waited for
# before the next); the gather tests under modes 1 and 2; then each mode, and the old copy path
# (MODMOE_SM90_GATHER=0), against mode 0 in the same binary, alternated.
set -u
cd "$(dirname "$0")/../../.."
export PATH="$PATH:/usr/local/cuda/bin"
t0=$(date +%s)
env CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++ cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DMODMOE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ > $OUT/build.log 2>&1
cmake --build build-gpu -j 16 --target modmoe_gpu_tests modmoe-bench >> $OUT/build.log 2>&1
echo "build rc=$? at $(( $(date +%s) - t0 )) s"; grep -m5 -B2 -A5 "error" $OUT/build.log | head -30
T=build-gpu/tests/modmoe_gpu_tests
for m in 1 2; do
  MODMOE_SM90_GATHER_MODE=$m timeout 60 $T --gtest_filter='Sm90GemmUnaligned.Gathered*:Sm90ExpertsGather.*:Routes/Sm90ExpertsQuantizeInput.*' > $OUT/tests-mode$m.log 2>&1
  echo "tests mode $m rc=$? at $(( $(date +%s) - t0 )) s: $(grep -E '^\[  (PASSED|FAILED)' $OUT/tests-mode$m.log | tr '\n' ' ')"
done
for v in MODMOE_SM90_GATHER_MODE=1 MODMOE_SM90_GATHER_MODE=2 MODMOE_SM90_GATHER=0; do
  [ $(( $(date +%s) - t0 )) -lt 480 ] || break
  rm -rf /tmp/ab; mkdir -p /tmp/ab
  BIN=build-gpu/tools/modmoe-bench OUT=/tmp/ab timeout 100 scripts/gpu-ab env "$v" --alternate --bench "--shapes standard --models mixtral-8x7b,qwen3.5-35b-a3b,deepseek-v3 --ms 128,1024,8192 --no-baseline --settle-ms 30" > /tmp/ab.log 2>&1
  echo "A/B $v rc=$? at $(( $(date +%s) - t0 )) s"
  { echo "######## $v against MODMOE_SM90_GATHER_MODE=0 (noinc), same binary"; cat /tmp/ab/ab.txt; } >> $OUT/ab-modes.txt
done
grep -v "^$" $OUT/ab-modes.txt | grep -v "gpu-ab:"
