#!/usr/bin/env bash
# Prepared in session 21 for a later one (never run on a GPU): what the captured forward's
# memory nodes cost. modmoe-bench without and with --arena (the workspaces from an
# ArenaAllocator: no graph memory nodes), alternated twice, M = 1 and 16 of the standard
# models; the graph-capture tests first (the _arena cases assert that no memory node is left).
# Also prints the new launch floors (an empty kernel between two allocations and their frees)
# and the write / copy ceilings. Run in place on the GPU machine (carry .deps); ~3 minutes.
set -u
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
scripts/gpu-build modmoe_gpu_tests modmoe-bench > "$OUT/build.log" 2>&1
echo "build rc=$? at $(( $(date +%s) - t0 )) s"
build-gpu/tests/modmoe_gpu_tests --gtest_filter='CudaPairs/GraphCapture.*' > /tmp/t.log 2>&1
echo "graph-capture tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' /tmp/t.log | tr '\n' ' ')"
grep -E "^\[  FAILED" /tmp/t.log | head
for round in 1 2; do
  for mode in plain arena; do
    flag=""; [ $mode = arena ] && flag="--arena"
    build-gpu/tools/modmoe-bench --shapes standard --ms 1,16 --no-baseline $flag \
      --json "$OUT/r$round-$mode.json" > "/tmp/b-$round-$mode.log" 2>&1 || echo "bench $mode rc=$?"
  done
done
grep -E "^(ceilings|graph launch)" /tmp/b-1-plain.log
python3 - "$OUT" <<'PY'
import json, sys, statistics
d = sys.argv[1]
t = {}
for r in (1, 2):
    for m in ("plain", "arena"):
        for c in json.load(open(f"{d}/r{r}-{m}.json"))["cases"]:
            t.setdefault((c["model"], c["quant"], c["M"]), {}).setdefault(m, []).append((c["time_us"], c["graph_nodes"]))
print("%-16s %-9s %3s %10s %10s %6s %s" % ("model", "quant", "M", "plain us", "arena us", "ratio", "nodes"))
for k in sorted(t):
    p = statistics.median(x[0] for x in t[k]["plain"]); a = statistics.median(x[0] for x in t[k]["arena"])
    print("%-16s %-9s %3d %10.1f %10.1f %6.3f %d -> %d" % (k + (p, a, a / p, t[k]["plain"][0][1], t[k]["arena"][0][1])))
PY
