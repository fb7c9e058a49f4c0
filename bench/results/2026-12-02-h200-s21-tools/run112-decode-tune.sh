#!/usr/bin/env bash
# Session 21, calls 2-3: the decode kernels' shapes swept (experiment build: MODMOE_DECODE_TUNE =
# "gate_up_warps,gate_up_depth,down_warps,down_depth,prefetch_mb,evict_first"; down_warps 0 = the heuristic's; prefetch_mb: gate_up asks w2 into the L2 when it is at most that many MB; evict_first: gate_up streams w13 evict-first).
# Each variant: the decode tests under it, then M = 1 of the standard models timed in
# three rounds (the second in reverse order). Run in place on the GPU machine (carry .deps).
set -u
cd "$(dirname "$0")/../../.."
t0=${T0:-$(date +%s)}  # T0, LIMIT: a caller's start and budget (run116)
scripts/gpu-build modmoe_gpu_tests modmoe-bench > $OUT/build.log 2>&1
echo "build rc=$? at $(( $(date +%s) - t0 )) s"; grep -m3 -A3 error $OUT/build.log
B=build-gpu
variants="${VARIANTS:-4,4,0,4,0,0 8,4,0,4,0,0 8,3,0,4,0,0 8,2,0,4,0,0 16,2,0,4,0,0 16,3,0,4,0,0 12,3,0,4,0,0 4,3,0,4,0,0 6,4,0,4,0,0 4,4,0,3,0,0 4,4,0,2,0,0 4,4,8,3,0,0 4,4,16,3,0,0 4,4,16,2,0,0}"
for v in $variants; do
  MODMOE_DECODE_TUNE=$v timeout 60 $B/tests/modmoe_gpu_tests --gtest_filter='Cases/DecodeMlp.*:*DecodeRoute*' > /tmp/t.log 2>&1
  echo "tests $v rc=$? $(grep -E '^\[  (PASSED|FAILED)' /tmp/t.log | tr '\n' ' ')"
done
mkdir -p /tmp/json
for round in ${ROUNDS:-1 2 3}; do
  order=$variants; [ $round = 2 ] && order=$(echo $variants | tr ' ' '\n' | tac | tr '\n' ' ')
  for v in $order; do
    [ $(( $(date +%s) - t0 )) -lt ${LIMIT:-500} ] || break 2
    MODMOE_DECODE_TUNE=$v timeout 90 $B/tools/modmoe-bench --shapes standard --ms ${MS:-1,4} --no-baseline --settle-ms ${SETTLE:-30} --json /tmp/json/r$round-$v.json > /tmp/b.log 2>&1 || { echo "bench $v rc=$?"; tail -3 /tmp/b.log; }
  done
  echo "round $round done at $(( $(date +%s) - t0 )) s"
done
tar -czf $OUT/json.tar.gz -C /tmp json
python3 - /tmp/json <<'PY' | tee $OUT/sweep.txt
import json, os, sys, glob, statistics
d = sys.argv[1]
res = {}
for f in sorted(glob.glob(d + "/r*.json")):
    v = os.path.basename(f)[3:-5]
    for c in json.load(open(f))["cases"]:
        key = (c["model"], c["quant"], c["M"])
        res.setdefault(key, {}).setdefault(v, []).append(c["time_us"])
vs = []
for k in res:
    for v in res[k]:
        if v not in vs: vs.append(v)
print("%-16s %-9s %2s " % ("model", "quant", "M") + " ".join("%9s" % v for v in vs))
for k in sorted(res):
    cells = []
    for v in vs:
        t = res[k].get(v)
        cells.append("%9s" % ("%.1f" % statistics.median(t) if t else "-"))
    print("%-16s %-9s %2d " % k + " ".join(cells))
# Each variant's time over BASE's, per case (below 1: faster than BASE).
base_v = os.environ.get("BASE", "")
if base_v in vs:
    print("\ntime / time of " + base_v)
    for k in sorted(res):
        b = statistics.median(res[k][base_v]) if base_v in res[k] else float("nan")
        print("%-16s %-9s %2d " % k + " ".join(
            "%9s" % ("%.3f" % (statistics.median(res[k][v]) / b) if v in res[k] else "-") for v in vs))
PY
