#!/usr/bin/env python3
"""Samples every second (issue 38, stripemix): the machine's busy and idle ticks, each ferry process's
CPU ticks, and each thread of a ferry-bench (the link emulators' forwarders are its threads).
Writes lines: t kind id ticks label. Usage: issue38-cpu-sample.py OUT (stops when OUT.stop exists)."""
import os, sys, time
out = open(sys.argv[1], "w")
stop = sys.argv[1] + ".stop"
hz = os.sysconf("SC_CLK_TCK")
def ticks(path):
    try:
        f = open(path).read()
    except OSError:
        return None
    rest = f[f.rindex(")") + 2:].split()
    return int(rest[11]) + int(rest[12])
while not os.path.exists(stop):
    t = time.time()
    cpu = open("/proc/stat").readline().split()[1:]
    cpu = list(map(int, cpu))
    out.write(f"{t:.2f} sys all {sum(cpu)} idle={cpu[3]+cpu[4]}\n")
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            comm = open(f"/proc/{pid}/comm").read().strip()
        except OSError:
            continue
        if not comm.startswith("ferry"):
            continue
        try:
            cmd = open(f"/proc/{pid}/cmdline").read().split("\0")
        except OSError:
            continue
        tk = ticks(f"/proc/{pid}/stat")
        if tk is None:
            continue
        label = " ".join(c for c in cmd[1:8] if c)[:120]
        out.write(f"{t:.2f} proc {pid} {tk} {comm}|{label}\n")
        if comm == "ferry-bench":
            try:
                for tid in os.listdir(f"/proc/{pid}/task"):
                    tt = ticks(f"/proc/{pid}/task/{tid}/stat")
                    tc = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
                    if tt:
                        out.write(f"{t:.2f} thr {tid} {tt} {tc}\n")
            except OSError:
                pass
    out.flush()
    time.sleep(1)
