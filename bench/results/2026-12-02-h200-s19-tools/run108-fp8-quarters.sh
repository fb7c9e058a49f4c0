#!/usr/bin/env bash
# Prepared in session 19 for a later one (never run on a GPU): s19-patches/fp8-quarters-pipelined-promotion.patch
# (the 64x256 fp8 consumers -- the 128x256 and 64x256 fp8 kernels -- run each K block as four n = 64
# quarters into two alternating product buffers: one quarter's wgmmas run while the previous one is
# promoted). Compiled here with nvcc 13.0 -Xptxas -v: no C7514 (wgmma serialization) warning, no spills
# (the 64x256 fp8 kernel's 8-byte spill gone). On the GPU: the fp8 GEMM suites on every tile, then an
# alternated A/B of the fp8 layers against .ab-base (`scripts/gpu-ab prepare HEAD` first), then the
# gpu-check if the M = 8192 fp8 layers gain. Copy to build-run/run108.sh; carry .deps, build-run, .ab-base.
set -u
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/cuda/bin"
t0=$(date +%s)
S=$OUT/call.txt
git apply bench/results/2026-12-02-h200-s19-patches/fp8-quarters-pipelined-promotion.patch || { echo "patch failed"; exit 1; }
ln -sfn "$PWD/.deps" .ab-base/.deps
cfg() { env CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++ cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release -DMODMOE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ > "$3" 2>&1; }
( cfg .ab-base /tmp/gpu-ab-base /tmp/cfg-base.log && cmake --build /tmp/gpu-ab-base -j 4 --target modmoe-bench > /tmp/build-base.log 2>&1 ) &
bp=$!
cfg . build-gpu /tmp/cfg-cand.log && cmake --build build-gpu -j 12 > /tmp/build-cand.log 2>&1
echo "cand build rc=$? at $(( $(date +%s) - t0 )) s" | tee -a $S; grep -m3 -A3 -E "error|C7514" /tmp/build-cand.log
T=$(find build-gpu -name modmoe_gpu_tests -type f | head -1)
timeout 200 $T --gtest_brief=1 --gtest_filter='*Sm90MoeGemm*:Sm90GemmUnaligned.*:*Sm90Experts*:*GraphCapture*' > /tmp/tests.log 2>&1
echo "tests rc=$? at $(( $(date +%s) - t0 )) s" | tee -a $S; grep -E "^\[  (PASSED|FAILED)|Failure|FAILED " /tmp/tests.log | head -12 | tee -a $S
wait $bp; echo "base build rc=$? at $(( $(date +%s) - t0 )) s" | tee -a $S
rm -rf /tmp/ab; mkdir -p /tmp/ab
OUT=/tmp/ab timeout 150 scripts/gpu-ab time /tmp/gpu-ab-base/tools/modmoe-bench build-gpu/tools/modmoe-bench --alternate --bench "--shapes standard --ms 16,1024,8192 --quants fp8-block --no-baseline --settle-ms 30" > /tmp/ab.log 2>&1
echo "A/B rc=$? at $(( $(date +%s) - t0 )) s" | tee -a $S; cp /tmp/ab/ab.txt $OUT/ab.txt
grep -E "^(==|model|whole)|fp8" $OUT/ab.txt | head -40
