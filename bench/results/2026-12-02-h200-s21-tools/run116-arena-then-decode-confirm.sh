#!/usr/bin/env bash
# Prepared in session 21 for a later one (never run on a GPU): run115 (the memory nodes' cost,
# --arena) and then run113 (the decode gate_up shapes at the default settle, with the knobs
# patch applied to the GPU machine's copy) in one call, each into its own folder, packed
# (the machine returns at most 8 files). ~8-9 minutes. Run in place; carry .deps.
set -u
cd "$(dirname "$0")/../../.."
tools=bench/results/2026-12-02-h200-s21-tools
t0=$(date +%s)
mkdir -p "$OUT/arena" "$OUT/decode"
OUT=$OUT/arena bash $tools/run115-arena.sh > "$OUT/arena/run.log" 2>&1
echo "run115 rc=$? at $(( $(date +%s) - t0 )) s"; cat "$OUT/arena/run.log" | tail -30
T0=$t0 LIMIT=520 OUT=$OUT/decode bash $tools/run113-decode-confirm.sh > "$OUT/decode/run.log" 2>&1
echo "run113 rc=$? at $(( $(date +%s) - t0 )) s"; grep -A40 "^time / time of" "$OUT/decode/run.log" | head -30
for d in arena decode; do tar -czf "$OUT/$d.tar.gz" -C "$OUT" "$d" && rm -rf "${OUT:?}/$d"; done
