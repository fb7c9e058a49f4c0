#!/usr/bin/env bash
# Thirty-second session, call 1: the thirty-first session's two prepared runs back to back
# (one machine start): run160 (the fp8 loop microbenchmark under the stage barriers; its files
# packed into r160.tar.gz, since a call sends back 8 files) then run159 (the one-fence-per-half
# TMA-store bound; gpu-ab's 7 files). Carry .deps and .ab-base.
set -u
cd "$(dirname "$0")/../../.."  # the repository root
S=bench/results/2026-12-04-h200-s31-tools
mkdir -p /tmp/r160
OUT=/tmp/r160 bash $S/run160-fp8-loop-bench-barriers.sh
tar czf "$OUT/r160.tar.gz" -C /tmp r160
bash $S/run159-tma-store-one-fence-per-half.sh
