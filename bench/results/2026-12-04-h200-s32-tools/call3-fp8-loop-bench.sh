#!/usr/bin/env bash
# Thirty-second session, call 3: fp8_loop_bench.cu with the variants added after call 1
# (halves256-nofullwait, -prewait, -prewait-filled), alone (call 2's run of it failed to link).
set -u
cd "$(dirname "$0")/../../.."  # the repository root
bash bench/results/2026-12-04-h200-s31-tools/run160-fp8-loop-bench-barriers.sh | grep -E "halves256|inplace256|round|^[0-9]"
