#!/usr/bin/env bash
# Thirty-third session, call 3: the programmatic launches' rule at 32 rows per busy expert
# instead of 16 (…-s33-patches/programmatic-rows-32.patch). Cases that change: Mixtral M = 128
# (32 rows), Qwen3.5 / DeepSeek-V3 / gpt-oss M = 1024 (32 rows). The ninth session saw bf16
# layers at M >= 1024 run 5-14 % slower with every launch programmatic (then without the
# weight-first order). Predicted: fp8 0.98-1.0, bf16 unclear (1-3 us of launch gap against
# layers of 300-1300 us).
set -u
cd "$(dirname "$0")/../../.."  # the repository root
scripts/gpu-ab run --patch bench/results/2026-12-04-h200-s33-patches/programmatic-rows-32.patch \
  --tests '*Programmatic*:Routes/*:*GraphCapture*' \
  --bench "--shapes standard --models mixtral-8x7b,qwen3.5-35b-a3b,deepseek-v3,gpt-oss-120b --ms 128,1024 --no-baseline" \
  --alternate > "$OUT/run.log" 2>&1
echo "gpu-ab run rc=$?"
grep -E "^(gpu-ab: cand|\[  (PASSED|FAILED)|model|whole|[a-z0-9.-]+ +(none|fp8-block))|FAILED|Failure" "$OUT/ab.txt" | head -40
