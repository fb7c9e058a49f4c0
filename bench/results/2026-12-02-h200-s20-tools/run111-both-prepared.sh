#!/usr/bin/env bash
# Prepared in session 20 for a later one (never run on a GPU): both of the session's prepared
# candidates in one GPU call, sharing the base build (/tmp/gpu-ab-base, HEAD): first the
# epilogue's ex2.ftz sigmoid (run109), then, with that patch taken back out of the GPU machine's
# copy, the gathered GEMM1 with whole rows per lane (run110). Each: its tests on the candidate,
# then an alternated A/B against HEAD; each run's folder is packed into one archive, with its
# ab.txt beside it (4 files come back: the machine returns at most 8). Here first:
# `scripts/gpu-ab prepare HEAD`; carry .deps and .ab-base.
set -u
cd "$(dirname "$0")/../../.."
patches=bench/results/2026-12-02-h200-s20-patches
t0=$(date +%s)
mkdir -p "$OUT/ex2" "$OUT/gather"
OUT=$OUT/ex2 bash bench/results/2026-12-02-h200-s20-tools/run109-ex2-ftz.sh > "$OUT/ex2/run.log" 2>&1
echo "ex2.ftz A/B rc=$? at $(( $(date +%s) - t0 )) s"
pack() { cp "$OUT/$1/ab.txt" "$OUT/$1-ab.txt" 2>/dev/null; tar -czf "$OUT/$1.tar.gz" -C "$OUT" "$1" && rm -rf "${OUT:?}/$1"; }
pack ex2
git apply -R "$patches/silu-ex2-ftz.patch" || { echo "could not take the ex2 patch back out"; exit 1; }
OUT=$OUT/gather bash bench/results/2026-12-02-h200-s20-tools/run110-gather-lane-per-row.sh > "$OUT/gather/run.log" 2>&1
echo "gather A/B rc=$? at $(( $(date +%s) - t0 )) s"
pack gather
for d in ex2 gather; do echo "######## $d"; grep -E "^(model|whole|[a-z0-9.-]+ +(none|fp8-block))" "$OUT/$d-ab.txt" 2>/dev/null | head -90; done
