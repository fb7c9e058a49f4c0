#!/usr/bin/env bash
# Session 19, call 3: the working tree's choose_tile (bf16 gated prefill GEMMs on 64x256) against
# .ab-base (HEAD 2b940a3): tests, an alternated A/B at M = 1024 / 8192, then the gpu-check if
# round 1 has Mixtral bf16 M = 1024 at <= 0.98. Carry .deps, build-run, .ab-base.
set -u
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/cuda/bin"
t0=$(date +%s)
S=$OUT/call.txt
ln -sfn "$PWD/.deps" .ab-base/.deps
cfg() { env CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++ cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release -DMODMOE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ > "$3" 2>&1; }
( cfg .ab-base /tmp/gpu-ab-base /tmp/cfg-base.log && cmake --build /tmp/gpu-ab-base -j 4 --target modmoe-bench > /tmp/build-base.log 2>&1 ) &
bp=$!
cfg . build-gpu /tmp/cfg-cand.log && cmake --build build-gpu -j 12 > /tmp/build-cand.log 2>&1
echo "cand build rc=$? at $(( $(date +%s) - t0 )) s" | tee -a $S; grep -m3 -A3 error /tmp/build-cand.log
T=$(find build-gpu -name modmoe_gpu_tests -type f | head -1)
timeout 150 $T --gtest_brief=1 --gtest_filter='Sm90TileRules.*:*Sm90Experts*:*Sm90MoeGemm*:*GraphCapture*:Sm90GemmUnaligned.*' > /tmp/tests.log 2>&1
echo "tests rc=$? at $(( $(date +%s) - t0 )) s" | tee -a $S; grep -E "^\[  (PASSED|FAILED)|Failure|FAILED " /tmp/tests.log | head -12 | tee -a $S
wait $bp; echo "base build rc=$? at $(( $(date +%s) - t0 )) s" | tee -a $S
rm -rf /tmp/ab; mkdir -p /tmp/ab
OUT=/tmp/ab timeout 120 scripts/gpu-ab time /tmp/gpu-ab-base/tools/modmoe-bench build-gpu/tools/modmoe-bench --alternate --bench "--shapes standard --ms 1024,8192 --no-baseline --settle-ms 30" > /tmp/ab.log 2>&1
echo "A/B rc=$? at $(( $(date +%s) - t0 )) s" | tee -a $S; cp /tmp/ab/ab.txt $OUT/ab.txt
mix=$(grep -m1 -E "^mixtral-8x7b +none +1024 " $OUT/ab.txt | awk '{print $NF}')
left=$(( 570 - ($(date +%s) - t0) ))
echo "first-round Mixtral bf16 M = 1024 $mix; $left s left" | tee -a $S
if [ -n "$mix" ] && awk -v m="$mix" 'BEGIN{exit !(m <= 0.98)}' && [ $left -gt 280 ]; then
  MODMOE_GPU_CHECK_BUDGET=$left MODMOE_MEMCHECK_FILTER='Sm90GemmUnaligned.*:CudaPairs/GraphCapture.*:Cases/DecodeMlp.*:CudaQuant.*:CudaReduce.*:CudaBatched.*:Routes/Sm90ExpertsQuantizeInput.*:CudaPermutePaths.*' MODMOE_RACECHECK_FILTER='Cases/DecodeMlp.*:Routes/Sm90ExpertsQuantizeInput.*:CudaPermutePaths.SingleBlock*:CudaPermutePaths.Automatic*' \
    bash scripts/gpu-check --steps build,tests,check,bench,memcheck,racecheck > /tmp/gpu-check.out 2>&1
  echo "gpu-check rc=$? at $(( $(date +%s) - t0 )) s" | tee -a $S
  cp /tmp/gpu-check.out $OUT/gpu-check.out
  tail -64 /tmp/gpu-check.out | grep -vE "^(mixtral|qwen|deepseek|gpt)"
else
  echo "gpu-check skipped" | tee -a $S
fi
grep -E "^(==|model|whole)|none " $OUT/ab.txt | head -40
