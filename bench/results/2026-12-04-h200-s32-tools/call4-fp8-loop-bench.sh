#!/usr/bin/env bash
# Thirty-second session, call 4: fp8_loop_bench.cu with the barrier variants added after call 3
# (halves256-relaxedarrive, -relaxedboth, -testwait, -allarrive): which part of the stage
# protocol's cost (barriers 1.32-1.37x, nofullwait 1.21x, halves256 alone 1.08x) is the arrive's
# release, the wait's acquire, try_wait's suspension, the lane-0 branch.
set -u
cd "$(dirname "$0")/../../.."  # the repository root
bash bench/results/2026-12-04-h200-s31-tools/run160-fp8-loop-bench-barriers.sh | grep -E "halves256|inplace256|round|^[0-9]"
