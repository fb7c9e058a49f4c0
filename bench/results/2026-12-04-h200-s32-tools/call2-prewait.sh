#!/usr/bin/env bash
# Thirty-second session, call 2. (1) fp8_loop_bench.cu again, with the variants added after call
# 1 (halves256-nofullwait: the barriers without the consumers' full wait; -prewait: block k + 1's
# full wait under block k's second-half wgmmas; -prewait-filled), its files packed into
# flb.tar.gz. (2) The kernel form of -prewait in fp8_main_loop_by_halves (the working tree)
# against HEAD: the Hopper, route, pair and graph tests on the candidate, the fp8 layers at
# M = 1024 and 8192 alternated, the kernel lists of Qwen3.5 fp8 M = 8192. Carry .deps, .ab-base.
set -u
cd "$(dirname "$0")/../../.."  # the repository root
mkdir -p /tmp/flbout && OUT=/tmp/flbout bash bench/results/2026-12-04-h200-s31-tools/run160-fp8-loop-bench-barriers.sh \
  | grep -E "halves256|inplace256|round"
tar czf "$OUT/flb.tar.gz" -C /tmp flbout
scripts/gpu-ab run --tests '*Sm90*:Routes/*:*GraphCapture*:CudaPairs*' \
  --bench "--shapes standard --quants fp8-block --ms 1024,8192 --no-baseline" --alternate \
  > "$OUT/run.log" 2>&1
echo "gpu-ab run rc=$?"
scripts/gpu-ab kernels qwen3.5-35b-a3b fp8-block 8192 >> "$OUT/run.log" 2>&1
grep -E "^(gpu-ab: cand|\[  (PASSED|FAILED)|model|whole|[a-z0-9.-]+ +fp8-block)" "$OUT/ab.txt" | head -40
for f in "$OUT"/kernels-*.txt; do echo "== $f"; sed -n 3,9p "$f"; done
# (As run in call 2 the microbenchmark's folder was /tmp/flb, the path run160 builds its binary
# at: the link failed and the microbenchmark did not run; the A/B ran. Corrected here to
# /tmp/flbout; call 3 ran the microbenchmark alone, call3-fp8-loop-bench.sh.)
