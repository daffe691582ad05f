#!/usr/bin/env python3
"""What arrives at the server, every 5 ms, while a command runs on the client host of a bed.

Why: a transfer's wall time hides where it is lost. The bytes arriving at the server's TUN
device (after the emulated bottleneck, so retransmissions that were dropped do not count) show
the set-up, the ramp, the steady rate and the tail separately. The tail of 16 streams at
100 ms (the last 8 MiB block of the slowest stream arriving a second after the others) was
found this way (DESIGN.md, "Blocks are cut smaller at both ends of a transfer").

Usage, as root, on a bed from `ferry-netem up --name NAME ...` with a server in NAME-s:

    python3 scripts/rx-timeline.py --bed NAME OUT -- ferry put --json /dev/shm/big 10.77.0.2:7070:/

writes OUT.rx (monotonic seconds, rx bytes), OUT.json / OUT.err (the command's output) and
prints: the wall time, when the first 2 MB had arrived, when the rate over 200 ms first passed
900 Mbit/s, when the last byte arrived, and the rate every 200 ms.
"""
import argparse
import os
import subprocess
import sys
import time


def poll(stop):
    f = open("/sys/class/net/fnm0/statistics/rx_bytes")
    while not os.path.exists(stop):
        f.seek(0)
        print(f"{time.monotonic():.5f} {int(f.read())}", flush=True)
        time.sleep(0.005)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--poll":
        return poll(sys.argv[2])
    ap = argparse.ArgumentParser()
    ap.add_argument("--bed", default="fnm")
    ap.add_argument("out")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        ap.error("no command")
    stop = f"/tmp/rx-timeline-stop-{os.getpid()}"
    poller = subprocess.Popen(
        ["ip", "netns", "exec", f"{a.bed}-s", sys.executable, os.path.abspath(__file__), "--poll", stop],
        stdout=open(a.out + ".rx", "w"),
    )
    try:
        time.sleep(0.3)
        t0 = time.monotonic()
        with open(a.out + ".json", "w") as out, open(a.out + ".err", "w") as err:
            rc = subprocess.run(["ip", "netns", "exec", f"{a.bed}-c"] + cmd, stdout=out, stderr=err).returncode
        wall = time.monotonic() - t0
        time.sleep(0.05)
    finally:
        open(stop, "w").close()
        poller.wait(timeout=10)
        os.unlink(stop)
    rows = [tuple(map(float, line.split())) for line in open(a.out + ".rx")]
    if len(rows) < 2:
        sys.exit("no samples")
    b0 = rows[0][1]
    rows = [(t - t0, b - b0) for t, b in rows]
    total = rows[-1][1]

    def first(at_least):
        return next((t for t, b in rows if b >= at_least), float("nan"))

    rates, j = [], 0
    for t, b in rows:
        while rows[j][0] < t - 0.2:
            j += 1
        rates.append((t, (b - rows[j][1]) * 8 / max(t - rows[j][0], 1e-3) / 1e6))
    full = next((t for t, r in rates if r > 900 and t > 0), float("nan"))
    last = first(total - 1e5)
    print(
        f"{a.out}: exit {rc}, wall {wall:.2f} s, {total * 8 / wall / 1e6:.0f} Mbit/s on the wire; "
        f"first 2 MB at {first(2e6):.2f} s, > 900 Mbit/s at {full:.2f} s, "
        f"last byte at {last:.2f} s, exit {wall - last:.2f} s after it"
    )
    print(" ".join(f"{t:.1f}:{r:.0f}" for t, r in rates[::40] if t >= 0))


if __name__ == "__main__":
    main()
