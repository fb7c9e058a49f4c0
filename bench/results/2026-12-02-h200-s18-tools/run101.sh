#!/usr/bin/env bash
# Session 18, call 8 (feasibility, not product): the swapped-operands tile widened to a 144-token side (bf16),
# on Mixtral M = 1024's GEMM shapes (plain), against 128x256: build-run/wide-swap.patch + build-run/wide_swap.cu.
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
export PATH="$PATH:/usr/local/cuda/bin"
t0=$(date +%s)
mkdir -p /tmp/w && tar --exclude=./build-gpu --exclude=./.ab-base --exclude=./.deps --exclude=./.git -cf - . | tar -C /tmp/w -xf -
ln -sfn "$PWD/.deps" /tmp/w/.deps
(cd /tmp/w && git init -q && git apply build-run/wide-swap.patch) || { echo "patch failed"; exit 1; }
env CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++ cmake -S /tmp/w -B /tmp/wb -DCMAKE_BUILD_TYPE=Release -DMODMOE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ > /tmp/cfg.log 2>&1
cmake --build /tmp/wb -j 16 --target wide-swap > /tmp/build.log 2>&1
echo "build rc=$? at $(( $(date +%s) - t0 )) s"; grep -m3 -B2 -A8 "error" /tmp/build.log | head -30
timeout 120 env ${WIDE_ENV:-} /tmp/wb/tools/wide-swap 2>&1 | tee $OUT/wide-swap.txt
echo "done at $(( $(date +%s) - t0 )) s"
