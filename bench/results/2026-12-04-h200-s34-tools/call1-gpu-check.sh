#!/usr/bin/env bash
# Thirty-fourth session, call 1: the record gpu-check of HEAD (ba38461), the first GPU run of
# `--focused-sanitizers` (the memcheck / racecheck lists now held by scripts/gpu-check).
set -u
cd "$(dirname "$0")/../../.."  # the repository root
MODMOE_GPU_CHECK_BUDGET=420 \
  bash scripts/gpu-check --steps build,tests,check,bench,memcheck,racecheck --focused-sanitizers \
  > "$OUT/gpu-check-stdout.log" 2>&1
echo "gpu-check rc=$?"
tail -45 "$OUT/gpu-check-stdout.log"
