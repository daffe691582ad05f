#!/usr/bin/env python3
"""How noisy a transfer's rate looks to the stream tuner, by counter and sample length.

Runs CMD (a transfer), polls `ss -ti` for its connections every 20 ms, and prints the
coefficient of variation of the rate over consecutive windows of 0.25-1 s (from 2.5 s in to
1 s before the end) counted two ways: `tcpi_bytes_acked` alone, and acked plus SACKed
segments x MSS (what ferry's tuner counts, `TcpInfo::delivered`). Run it where the
transfer's client runs, e.g. on the bed (docs/bench/NOTEBOOK.md, "Auto-tuning against fixed settings"):

  ferry-netem exec --name fp client -- python3 scripts/rate-noise.py 10.77.0.2 7070 -- \
      ferry put /dev/shm/fp/src/big 10.77.0.2:7070:/ --streams 8
"""
import bisect
import re
import statistics
import subprocess
import sys
import time

ACKED = re.compile(r"bytes_acked:(\d+)")
SACKED = re.compile(r" sacked:(\d+)")
MSS = re.compile(r" mss:(\d+)")


def sample(host, port):
    out = subprocess.run(
        ["ss", "-tinH", "dst", host, "dport", "=", port],
        capture_output=True, text=True, check=False,
    ).stdout
    acked = delivered = 0
    # ss prints each connection's TCP_INFO on the line after its addresses.
    for line in out.splitlines():
        a, m = ACKED.search(line), MSS.search(line)
        if not a or not m:
            continue
        s = SACKED.search(line)
        acked += int(a.group(1))
        delivered += int(a.group(1)) + (int(s.group(1)) if s else 0) * int(m.group(1))
    return acked, delivered


def main():
    if len(sys.argv) < 5 or sys.argv[3] != "--":
        sys.exit(__doc__)
    host, port, cmd = sys.argv[1], sys.argv[2], sys.argv[4:]
    t0 = time.monotonic()
    child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    points = []
    while child.poll() is None and time.monotonic() - t0 < 600:
        points.append((time.monotonic() - t0, *sample(host, port)))
        time.sleep(0.02)
    child.wait()
    if child.returncode != 0:
        sys.exit(f"{cmd[0]} exited {child.returncode}")
    times = [p[0] for p in points]
    end = times[-1] - 1.0 if times else 0.0
    for col, name in ((1, "acked"), (2, "acked+sacked")):
        cells = []
        for w in (0.25, 0.5, 1.0):
            rates, t = [], 2.5
            while t + w <= end:
                a = points[bisect.bisect_right(times, t) - 1]
                b = points[bisect.bisect_right(times, t + w) - 1]
                if b[col] >= a[col] and b[0] > a[0]:
                    rates.append((b[col] - a[col]) * 8 / (b[0] - a[0]) / 1e6)
                t += w
            if len(rates) > 2 and statistics.mean(rates) > 0:
                cv = 100 * statistics.pstdev(rates) / statistics.mean(rates)
                cells.append(f"{w} s: cv {cv:4.1f}% (mean {statistics.mean(rates):.0f} Mbit/s)")
        print(f"{name:13} " + " | ".join(cells))


if __name__ == "__main__":
    main()
