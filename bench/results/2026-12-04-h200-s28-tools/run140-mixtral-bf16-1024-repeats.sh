#!/usr/bin/env bash
# Session 28, call 3: Mixtral bf16 M = 1024 against the cuBLAS baseline, six times over (each run
# times modmoe's graph and cuBLAS's per-expert loop in the same process, 50 replays each): is the
# gpu-check's 0.996x (and the twenty-sixth session's 1.005x) a tie that the run's variance turns?
set -u
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
scripts/gpu-build --build build-gpu --jobs 16 modmoe-bench > "$OUT/build.log" 2>&1
echo "build rc=$? $(( $(date +%s) - t0 )) s"
for i in 1 2 3 4 5 6; do
  build-gpu/tools/modmoe-bench --shapes standard --models mixtral-8x7b --ms 1024 --quants none \
    --replays 50 > "$OUT/run$i.txt" 2>&1
  echo "run $i rc=$?: $(grep -E '^mixtral-8x7b' "$OUT/run$i.txt" | head -1)"
done
echo "total $(( $(date +%s) - t0 )) s"
