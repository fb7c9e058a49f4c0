#!/usr/bin/env bash
# Thirty-fourth session, call 3 (call 2 found a fresh machine without build-gpu/): the racecheck
# that call 1's budget of 420 s cut short, on a new build of the same tree.
set -u
cd "$(dirname "$0")/../../.."  # the repository root
bash scripts/gpu-check --steps build,racecheck --focused-sanitizers > "$OUT/racecheck-stdout.log" 2>&1
echo rc=$?
tail -6 "$OUT/racecheck-stdout.log"
