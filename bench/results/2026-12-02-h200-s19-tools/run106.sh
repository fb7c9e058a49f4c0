#!/usr/bin/env bash
# Session 19, call 5 (study): where Mixtral bf16 M = 1 / 1024's time goes (ncu kernel list), and gpt-oss bf16 M = 8192's GEMM2 on 128x256 vs 64x256 (ncu; the env knob of
# s19-patches/tile-knobs-experiment.patch, applied here only).
set -u
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/cuda/bin"
t0=$(date +%s)
git apply bench/results/2026-12-02-h200-s19-patches/tile-knobs-experiment.patch || { echo "patch failed"; exit 1; }
env CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++ cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DMODMOE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ > /tmp/cfg.log 2>&1
cmake --build build-gpu -j 16 --target modmoe-bench modmoe-profile > /tmp/build.log 2>&1
echo "build rc=$? at $(( $(date +%s) - t0 )) s"; grep -m3 -A3 error /tmp/build.log
{ timeout 60 scripts/gpu-kernels mixtral-8x7b none 1024; timeout 60 scripts/gpu-kernels mixtral-8x7b none 1; } > $OUT/kernels.txt 2>&1
echo "kernels rc=$? at $(( $(date +%s) - t0 )) s"
for v in none 64x256; do
  [ $(( $(date +%s) - t0 )) -lt 330 ] || break
  e=""; [ $v = none ] || e="MODMOE_X_TILE_PLAIN=$v"
  { echo "######## gpt-oss bf16 8192, plain tile $v"; env $e timeout 60 scripts/gpu-kernels gpt-oss-120b none 8192; } >> $OUT/kernels.txt 2>&1
done
echo "done at $(( $(date +%s) - t0 )) s"
cat $OUT/kernels.txt
