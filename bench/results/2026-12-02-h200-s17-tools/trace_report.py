#!/usr/bin/env python3
"""Summarises the MODMOE_X_TRACE dumps (experiment): python3 trace_report.py trace-*.bin"""
import struct, sys
import numpy as np

for path in sys.argv[1:]:
    raw = open(path, 'rb').read()
    grid, bm, bn, fp8, kblocks, stages = struct.unpack('6i', raw[:24])
    t = np.frombuffer(raw[24:], dtype=np.uint64).reshape(grid, 64).astype(np.float64)
    g0, c0, gP, cP = t[:, 0], t[:, 1], t[:, 2], t[:, 3]
    rate = (cP - c0) / np.maximum(gP - g0, 1)  # cycles per ns
    n = t[:, 54].astype(int)
    gend = np.maximum(t[:, 55], t[:, 56])
    k0 = g0.min()
    us = lambda cyc, c: cyc / rate[c] / 1e3
    print(f"== {path}: grid {grid}, {bm}x{bn} fp8={fp8}, {kblocks} K blocks, {stages} stages; "
          f"clock {rate.mean():.2f} GHz; tiles/CTA min {n.min()} max {n.max()} sum {n.sum()}")
    print(f"   span {(gend.max() - k0) / 1e3:.1f} us; CTA starts skew {(g0.max() - k0) / 1e3:.2f} us; "
          f"CTA ends (us from first start) p0 {np.percentile(gend - k0, 0) / 1e3:.1f} p50 {np.percentile(gend - k0, 50) / 1e3:.1f} "
          f"p90 {np.percentile(gend - k0, 90) / 1e3:.1f} max {(gend.max() - k0) / 1e3:.1f}; producer ends p50 {np.percentile(gP - k0, 50) / 1e3:.1f} max {(gP.max() - k0) / 1e3:.1f}")
    warm = t[:, 57]
    if warm.max() > 0:
        print(f"   consumer 1's warm-up pass ends {np.mean([us(warm[c] - c0[c], c) for c in range(grid)]):.2f} us after CTA start")
    if t[:, 60].max() > 0:  # the startup stamps (later versions of gemm-trace.patch)
        prod = np.mean([us(t[c, 60] - c0[c], c) for c in range(grid)])
        sched = np.mean([us(t[c, 58] - c0[c], c) for c in range(grid) if t[c, 58] > 0])
        print(f"   startup (us from CTA start): producer code reached {prod:.2f}, scheduler's m_indptr copy landed {sched:.2f}")
    print("   tile  CTAs  got(us)  ml_start  ml_len  full_wait  epi_len  gap_before  prod_empty_wait")
    for i in range(min(8, n.max())):
        cs = [c for c in range(grid) if n[c] > i]
        got = np.mean([us(t[c, 4 + i] - c0[c], c) for c in cs])
        ms = np.mean([us(t[c, 20 + i] - c0[c], c) for c in cs])
        ml = np.mean([us(t[c, 28 + i] - t[c, 20 + i], c) for c in cs])
        fw = np.mean([us(t[c, 44 + i], c) for c in cs])
        ep = np.mean([us(t[c, 36 + i] - t[c, 28 + i], c) for c in cs if t[c, 36 + i] > 0])
        gap = np.mean([us(t[c, 20 + i] - t[c, 28 + i - 1], c) for c in cs]) if i > 0 else float('nan')
        pw = np.mean([us(t[c, 12 + i] - (t[c, 12 + i - 1] if i else 0), c) for c in cs])
        print(f"   {i:4d} {len(cs):5d} {got:8.2f} {ms:9.2f} {ml:7.2f} {fw:10.2f} {ep:8.2f} {gap:11.2f} {pw:16.2f}")
    last_ml_end = np.array([us(t[c, 28 + min(n[c], 8) - 1] - c0[c], c) for c in range(grid)])
    end = np.array([us(max(t[c, 52], t[c, 53]) - c0[c], c) for c in range(grid)])
    print(f"   last main loop end (us from CTA start) mean {last_ml_end.mean():.1f}, CTA end mean {end.mean():.1f} -> tail {np.mean(end - last_ml_end):.2f} us")
