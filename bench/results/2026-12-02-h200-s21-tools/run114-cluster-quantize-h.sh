#!/usr/bin/env bash
# Prepared in session 21 for a later one (never run on a GPU): fp8 decode with h quantized by
# gate_up itself, in clusters of 16 CTAs (one scale group of h's row each, the 16 amaxes through
# distributed shared memory), instead of by the quantize_h kernel after it
# (`…-s21-patches/decode-gate-up-quantizes-h-in-clusters.patch`). The decode, route and
# graph-capture tests on the candidate first (among them SameBytesWhetherGateUpOrAKernelQuantizesH:
# the same output bytes with MODMOE_DECODE_CLUSTER_H=0), then the fp8 decode-sized layers
# against HEAD, alternated. Here first: `scripts/gpu-ab prepare HEAD`; carry .deps and .ab-base.
# Predicted: fp8 M = 1 2-3 us faster (one kernel and one grid dependency fewer), M = 2-4 likewise;
# bf16 unchanged.
set -u
cd "$(dirname "$0")/../../.."
scripts/gpu-ab run --patch bench/results/2026-12-02-h200-s21-patches/decode-gate-up-quantizes-h-in-clusters.patch \
  --tests 'Cases/DecodeMlp.*:DecodeRoute*:*GraphCapture*' \
  --bench "--shapes standard --ms 1,2,4 --no-baseline" --alternate > "$OUT/run.log" 2>&1
echo "gpu-ab rc=$?"
grep -E "^(gpu-ab: cand|\[  (PASSED|FAILED)|model|whole|[a-z0-9.-]+ +(none|fp8-block))" "$OUT/ab.txt" | head -80
