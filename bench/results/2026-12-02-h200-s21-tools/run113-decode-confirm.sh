#!/usr/bin/env bash
# Prepared in session 21 for a later one (never run): confirms dd8eedb's decode gate_up shapes
# at the benchmark's default settle (300 ms; the sweep that chose them ran at 30 ms, docs/perf.md
# twenty-first session §2) and tries the shapes the sweep left open (8 warps x 2 stages for fp8 at
# long K; down's depth 3). Applies `…-s21-patches/decode-tune-knobs-on-dd8eedb.patch` to the GPU
# machine's copy (MODMOE_DECODE_TUNE="gate_up warps,gate_up depth,down warps,down depth", 0 = the
# rule's value; "4,4,0,4" = the shapes before dd8eedb; "0,0,4,x": down with 4 warps, untried), then run112's loop: the decode tests under
# each shape, two rounds of M = 1 and 4 (the second in reverse order), a table of medians.
# Run in place on the GPU machine (carry .deps); ~5 minutes.
set -u
cd "$(dirname "$0")/../../.."
git apply bench/results/2026-12-02-h200-s21-patches/decode-tune-knobs-on-dd8eedb.patch || exit 1
VARIANTS="0,0,0,0 4,4,0,4 8,2,0,0 8,3,0,0 4,2,0,0 0,0,0,3 0,0,8,3 0,0,4,4 0,0,4,3" ROUNDS="1 2" SETTLE=300 \
  BASE=0,0,0,0 bash bench/results/2026-12-02-h200-s21-tools/run112-decode-tune.sh
