#!/usr/bin/env bash
# The gated fp8-out epilogue of the 128-row tiles with 8-byte stores (a quad's code pairs
# transposed by two shuffles) against HEAD: the Hopper, route, pair and graph tests on the
# candidate (the working tree), the fp8 layers at M = 1024 and 8192 (alternated), and both
# kernel lists of Qwen3.5 fp8 M = 8192. Here first: `scripts/gpu-ab prepare HEAD`; carry .deps
# and .ab-base. ~4 minutes.
set -u
cd "$(dirname "$0")/../../.."  # the repository root
scripts/gpu-ab run --tests '*Sm90*:Routes/*:*GraphCapture*:CudaPairs*' \
  --bench "--shapes standard --quants fp8-block --ms 1024,8192 --no-baseline" --alternate \
  > "$OUT/run.log" 2>&1
echo "gpu-ab run rc=$?"
scripts/gpu-ab kernels qwen3.5-35b-a3b fp8-block 8192 >> "$OUT/run.log" 2>&1
grep -E "^(gpu-ab: cand|\[  (PASSED|FAILED)|model|whole|[a-z0-9.-]+ +fp8-block)" "$OUT/ab.txt" | head -40
for f in "$OUT"/kernels-*.txt; do echo "== $f"; sed -n 3,9p "$f"; done
