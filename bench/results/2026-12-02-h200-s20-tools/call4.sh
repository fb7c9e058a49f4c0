#!/usr/bin/env bash
# Session 20, call 4: the gathered GEMM1 with one TMA box per row (produce_gathered). Build; the
# gather tests and the Hopper suites; then the A/B of one binary: base = gathered (default),
# candidate = MODMOE_SM90_GATHER=0 (the copy kernels), alternated. If the copy path is slower
# (its median cand/base > 1 in both rounds), the gpu-check of this code follows in the same call.
set -u
cd "$(dirname "$0")/../../.."
export PATH="$PATH:/usr/local/cuda/bin"
t0=$(date +%s)
env CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++ cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DMODMOE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ > $OUT/build.log 2>&1
cmake --build build-gpu -j 16 --target modmoe_gpu_tests modmoe-bench >> $OUT/build.log 2>&1
echo "build rc=$? at $(( $(date +%s) - t0 )) s"; grep -m5 -B2 -A5 "error" $OUT/build.log | head -30
T=build-gpu/tests/modmoe_gpu_tests
timeout 120 $T --gtest_filter='Sm90GemmUnaligned.*:Sm90ExpertsGather.*:Routes/Sm90ExpertsQuantizeInput.*:*GraphCapture*' > $OUT/tests.log 2>&1
trc=$?
echo "tests rc=$trc at $(( $(date +%s) - t0 )) s: $(grep -E '^\[  (PASSED|FAILED)' $OUT/tests.log | tr '\n' ' ')"
grep -m10 -B2 -A8 "Failure" $OUT/tests.log | head -40
[ $trc -eq 0 ] || exit 1
rm -rf /tmp/ab; mkdir -p /tmp/ab
BIN=build-gpu/tools/modmoe-bench OUT=/tmp/ab timeout 150 scripts/gpu-ab env "MODMOE_SM90_GATHER=0" --alternate --bench "--shapes standard --ms 16,128,1024,8192 --no-baseline --settle-ms 30" > /tmp/ab.log 2>&1
echo "A/B rc=$? at $(( $(date +%s) - t0 )) s"; cp /tmp/ab/ab.txt $OUT/ab-gather-tma.txt
grep -v "^$" $OUT/ab-gather-tma.txt | grep -v "gpu-ab:"
medians=$(grep "whole layer" $OUT/ab-gather-tma.txt | sed 's/.*median \([0-9.]*\).*/\1/')
echo "medians (copy path / gathered): $medians"
if echo "$medians" | awk 'NF{ if ($1 <= 1.0) bad=1 } END{ exit bad }'; then
  MODMOE_GPU_CHECK_BUDGET=$(( 585 - ($(date +%s) - t0) )) MODMOE_MEMCHECK_FILTER='Sm90GemmUnaligned.*:Sm90ExpertsGather.*:CudaPairs/GraphCapture.*:Cases/DecodeMlp.*:CudaQuant.*:CudaReduce.*:CudaBatched.*:Routes/Sm90ExpertsQuantizeInput.*:CudaPermutePaths.*' MODMOE_RACECHECK_FILTER='Cases/DecodeMlp.*:Routes/Sm90ExpertsQuantizeInput.*:Sm90ExpertsGather.*:CudaPermutePaths.SingleBlock*:CudaPermutePaths.Automatic*' \
    bash scripts/gpu-check --steps build,tests,check,bench,memcheck,racecheck > /tmp/gpu-check.out 2>&1
  echo "gpu-check rc=$? at $(( $(date +%s) - t0 )) s"
  cp /tmp/gpu-check.out $OUT/gpu-check.out
  tail -72 /tmp/gpu-check.out
else
  echo "gathered path not faster: no gpu-check"
fi
