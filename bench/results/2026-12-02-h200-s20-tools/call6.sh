#!/usr/bin/env bash
# Session 20, call 6: the gathered GEMM1 with three copying warps (warps 0, 2, 3 of the producer
# warpgroup, a third of each stage's rows each; cp.async + noinc arrives). Build; the gather tests
# and the Hopper suites; the A/B of one binary: base = gathered, candidate = MODMOE_SM90_GATHER=0
# (the copy kernels), alternated; the SASS of the fp8 gated 64x256 kernel for the code-size study.
set -u
cd "$(dirname "$0")/../../.."
export PATH="$PATH:/usr/local/cuda/bin"
t0=$(date +%s)
env CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++ cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DMODMOE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ > $OUT/build.log 2>&1
cmake --build build-gpu -j 16 --target modmoe_gpu_tests modmoe-bench >> $OUT/build.log 2>&1
echo "build rc=$? at $(( $(date +%s) - t0 )) s"; grep -m5 -B2 -A5 "error" $OUT/build.log | head -30
T=build-gpu/tests/modmoe_gpu_tests
timeout 90 $T --gtest_filter='Sm90GemmUnaligned.*:Sm90ExpertsGather.*:*Sm90Experts*:*GraphCapture*' > $OUT/tests.log 2>&1
trc=$?
echo "tests rc=$trc at $(( $(date +%s) - t0 )) s: $(grep -E '^\[  (PASSED|FAILED)' $OUT/tests.log | tr '\n' ' ')"
grep -m10 -B2 -A8 "Failure" $OUT/tests.log | head -40
if [ $trc -eq 0 ]; then
  rm -rf /tmp/ab; mkdir -p /tmp/ab
  BIN=build-gpu/tools/modmoe-bench OUT=/tmp/ab timeout 120 scripts/gpu-ab env "MODMOE_SM90_GATHER=0" --alternate --bench "--shapes standard --ms 16,128,1024,8192 --no-baseline --settle-ms 30" > /tmp/ab.log 2>&1
  echo "A/B rc=$? at $(( $(date +%s) - t0 )) s"; cp /tmp/ab/ab.txt $OUT/ab-gather-3warps.txt
fi
obj=$(find build-gpu -name 'sm90_gemm.cu.o' | head -1)
timeout 30 cuobjdump -sass -fun '_ZN6modmoe4cuda4sm9019grouped_gemm_kernelINS1_10TileConfigILi64ELi256ELb1ELb0EEEEEv14CUtensorMap_stS5_S5_NS1_12KernelParamsE' "$obj" 2>&1 | gzip > $OUT/sass-fp8-64x256.txt.gz
echo "sass at $(( $(date +%s) - t0 )) s: $(ls -la $OUT/sass-fp8-64x256.txt.gz | awk '{print $5}') bytes"
grep -v "^$" $OUT/ab-gather-3warps.txt 2>/dev/null | grep -v "gpu-ab:"
