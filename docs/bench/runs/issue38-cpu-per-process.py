#!/usr/bin/env python3
"""issue38-cpu-per-process.py OUT [T0 T1] (OUT from issue38-cpu-sample.py): CPU seconds per process label and per bench thread name, and
machine busy share, between unix times T0 and T1 (or whole file)."""
import sys, collections
hz = 100
lines = [l.split(None, 4) for l in open(sys.argv[1])]
t0 = float(sys.argv[2]) if len(sys.argv) > 2 else 0
t1 = float(sys.argv[3]) if len(sys.argv) > 3 else 1e18
first, last = {}, {}
sysfirst = syslast = None
for p in lines:
    t = float(p[0])
    if t < t0 or t > t1: continue
    if p[1] == "sys":
        idle = int(p[4].split("=")[1]); tot = int(p[3])
        if sysfirst is None: sysfirst = (t, tot, idle)
        syslast = (t, tot, idle)
        continue
    key = (p[1], p[2], p[4].strip() if len(p) > 4 else "")
    v = int(p[3])
    first.setdefault(key, (t, v)); last[key] = (t, v)
agg = collections.Counter()
for k in last:
    d = (last[k][1] - first[k][1]) / hz
    kind, _, label = k
    if kind == "thr":
        label = "thr:" + label.rstrip("0123456789")
    agg[(kind, label)] += d
span = syslast[0] - sysfirst[0]
busy = 1 - (syslast[2] - sysfirst[2]) / max(1, syslast[1] - sysfirst[1])
print(f"span {span:.1f}s machine busy {busy*100:.0f}% of 2 cores")
for (kind, label), d in agg.most_common(25):
    if d > 0.05: print(f"{d:7.2f}s {d/span*100:5.0f}% {kind} {label}")
