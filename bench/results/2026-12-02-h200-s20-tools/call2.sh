#!/usr/bin/env bash
# Session 20, call 2: GEMM1 reading its rows through sorted_token (gathered A, cp.async
# producer). Build, the Hopper tests (+ the new gather tests), memcheck of the gather tests, then
# an A/B of one binary: base = gathered (default), candidate = MODMOE_SM90_GATHER=0 (the old
# gather / quantize-scatter copy), alternated. Then ncu kernel lists of two cases.
set -u
cd "$(dirname "$0")/../../.."
export PATH="$PATH:/usr/local/cuda/bin"
t0=$(date +%s)
env CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++ cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DMODMOE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ > $OUT/build.log 2>&1
cmake --build build-gpu -j 16 --target modmoe_gpu_tests modmoe-bench modmoe-profile >> $OUT/build.log 2>&1
echo "build rc=$? at $(( $(date +%s) - t0 )) s"; grep -m5 -B2 -A5 "error" $OUT/build.log | head -30
T=build-gpu/tests/modmoe_gpu_tests
timeout 240 $T --gtest_filter='Sm90GemmUnaligned.*:Sm90ExpertsGather.*:*Sm90MoeGemm*:*Sm90Experts*:*GraphCapture*:Routes/*:AllPairs/CudaCombinations.*' > $OUT/tests.log 2>&1
echo "tests rc=$? at $(( $(date +%s) - t0 )) s"; grep -E "^\[  FAILED|^\[  PASSED|tests ran" $OUT/tests.log | head -20
grep -m20 -B2 -A8 "Failure" $OUT/tests.log | head -60
timeout 150 compute-sanitizer --tool memcheck $T --gtest_filter='Sm90GemmUnaligned.Gathered*:Sm90ExpertsGather.*:Routes/Sm90ExpertsQuantizeInput.M300*' > $OUT/memcheck.log 2>&1
echo "memcheck rc=$? at $(( $(date +%s) - t0 )) s"; grep -E "ERROR SUMMARY|PASSED|FAILED" $OUT/memcheck.log | head -5
mkdir -p /tmp/ab
BIN=build-gpu/tools/modmoe-bench OUT=/tmp/ab timeout 150 scripts/gpu-ab env "MODMOE_SM90_GATHER=0" --alternate --bench "--shapes standard --ms 16,128,1024,8192 --no-baseline --settle-ms 30" > /tmp/ab.log 2>&1
echo "A/B rc=$? at $(( $(date +%s) - t0 )) s"; cp /tmp/ab/ab.txt $OUT/ab-gather.txt 2>/dev/null; tail -5 /tmp/ab.log
for c in "qwen3.5-35b-a3b fp8-block 8192" "mixtral-8x7b none 1024"; do
  [ $(( $(date +%s) - t0 )) -lt 500 ] || break
  echo "== $c (gathered)" >> $OUT/kernels.txt; timeout 60 scripts/gpu-kernels $c >> $OUT/kernels.txt 2>&1
done
cat $OUT/ab-gather.txt 2>/dev/null | grep -v "^$"
cat $OUT/kernels.txt 2>/dev/null | tail -30
