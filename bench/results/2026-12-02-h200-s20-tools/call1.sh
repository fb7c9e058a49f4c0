#!/usr/bin/env bash
# Session 20, call 1: s19's prepared fp8 quarters A/B (run108), then, in the time left, s19's
# mid-M tile study (run107's variants) on the base binary gpu-ab just built (HEAD, unpatched).
set -u
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
mkdir -p $OUT/q
OUT=$OUT/q bash bench/results/2026-12-02-h200-s19-tools/run108-fp8-quarters.sh > $OUT/run108.log 2>&1
echo "run108 rc=$? at $(( $(date +%s) - t0 )) s"
tar -czf $OUT/q.tar.gz -C $OUT q && cp $OUT/q/ab.txt $OUT/ab-quarters.txt 2>/dev/null; rm -rf $OUT/q
BIN=/tmp/gpu-ab-base/tools/modmoe-bench
[ -x "$BIN" ] || BIN=$(find /tmp/gpu-ab-base -name modmoe-bench -type f | head -1)
echo "base bin: $BIN"
for v in MODMOE_SM90_TILE_GATED=128x256 MODMOE_SM90_TILE_PLAIN=64x256 MODMOE_SM90_TILE_GATED=64x256 MODMOE_SM90_TILE_PLAIN=128x256; do
  [ $(( $(date +%s) - t0 )) -lt 500 ] || break
  rm -rf /tmp/ab; mkdir -p /tmp/ab
  BIN=$BIN OUT=/tmp/ab timeout 90 scripts/gpu-ab env "$v" --alternate --bench "--shapes standard --ms 2048,4096 --no-baseline --settle-ms 30" > /tmp/ab.log 2>&1
  echo "A/B $v rc=$? at $(( $(date +%s) - t0 )) s"
  { echo "######## $v (base = the heuristic's tiles, same binary)"; cat /tmp/ab/ab.txt; } >> $OUT/ab-midm.txt
done
echo "=== quarters"; cat $OUT/ab-quarters.txt 2>/dev/null | tail -40
echo "=== mid-M"; grep -E "^(######|whole)" $OUT/ab-midm.txt
