#!/usr/bin/env bash
# Session 30 call 7: the <= 128-column fp8 consumers' K blocks in pairs (working tree) against
# HEAD, with plain GEMMs forced onto 128x128 in both (MODMOE_SM90_TILE_PLAIN) so that every GEMM2
# runs the changed loop. Here first: `scripts/gpu-ab prepare HEAD`; carry .deps and .ab-base.
set -u
cd "$(dirname "$0")/../../.."  # the repository root
MODMOE_SM90_TILE_PLAIN=128x128 scripts/gpu-ab run --tests '*Sm90MoeGemm*:*Sm90GemmUnaligned*:Routes/*' \
  --bench "--shapes standard --models mixtral-8x7b,qwen3.5-35b-a3b --ms 16,1024,8192 --quants fp8-block --no-baseline" \
  > "$OUT/run.log" 2>&1
echo "gpu-ab rc=$?"
grep -E "^(gpu-ab: cand|\[  (PASSED|FAILED)|model|whole|median|[a-z0-9.-]+ +(none|fp8-block))" "$OUT/ab.txt" | head -60
tar -xzOf "$OUT/logs.tar.gz" ./tests.log 2>/dev/null | grep -E "FAILED|Failure" | head -20
