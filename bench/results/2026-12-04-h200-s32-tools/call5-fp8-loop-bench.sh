#!/usr/bin/env bash
# Thirty-second session, call 5: fp8_loop_bench.cu with the variants added after call 4
# (halves256-hintproducer, -hintboth): whether the waiting threads polling the barriers
# (try_wait with its default time limit) is the stage protocol's cost.
set -u
cd "$(dirname "$0")/../../.."  # the repository root
bash bench/results/2026-12-04-h200-s31-tools/run160-fp8-loop-bench-barriers.sh | grep -E "halves256|inplace256|round|^[0-9]"
