#!/usr/bin/env bash
# Thirty-third session, call 1: (a) the Sm90Programmatic mutation the thirty-second session left
# unrun (…-s32-tools/call10-mutation-alone.sh: the producer's wait removed; with the test's normal
# first launch it should now FAIL), then (b) the programmatic weighted reduce A/B prepared there
# (…-s32-tools/next-reduce-programmatic-ab.sh; predicted 0.5-1.5 us off fp8 M = 16 / 128).
set -u
cd "$(dirname "$0")/../../.."  # the repository root
S32=bench/results/2026-12-04-h200-s32-tools
{ echo "== mutation"; bash $S32/call10-mutation-alone.sh; echo "mutation script rc=$?"; } 2>&1 | tee "$OUT/mutation.txt"
git status --short | head -5
echo "== reduce A/B"
bash $S32/next-reduce-programmatic-ab.sh
