#!/usr/bin/env bash
# Session 23, call 4: an A/A of scripts/gpu-ab — the working tree is HEAD itself (nothing
# changed), built into build-gpu/ like a candidate, against HEAD's .ab-base build — at M = 1
# of the standard models, alternated. Calls 1-3 each measured Qwen3 / Qwen3.5 bf16 M = 1 2-6 %
# slower for three unrelated `down` changes; this says whether the two builds differ by
# themselves there. Here first: `scripts/gpu-ab prepare HEAD`; carry .deps and .ab-base. ~3 min.
set -u
cd "$(dirname "$0")/../../.."
git status --short -- src include tools | head -5
scripts/gpu-ab run --bench "--shapes standard --ms 1 --no-baseline" --alternate > "$OUT/run.log" 2>&1
echo "gpu-ab rc=$?"
grep -E "^(gpu-ab: cand|model|whole|[a-z0-9.-]+ +(none|fp8-block))" "$OUT/ab.txt" |
  grep -v -E "hopper|grouped" | head -60
