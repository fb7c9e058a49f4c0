#!/usr/bin/env bash
# Thirty-fourth session, call 6: the record gpu-check of 5336a7f's kernels (the branch-free
# fp8-out scales), focused sanitizers, gpu-check's default budget.
set -u
cd "$(dirname "$0")/../../.."  # the repository root
bash scripts/gpu-check --steps build,tests,check,bench,memcheck,racecheck --focused-sanitizers \
  > "$OUT/gpu-check-stdout.log" 2>&1
echo "gpu-check rc=$?"
tail -12 "$OUT/gpu-check-stdout.log"
