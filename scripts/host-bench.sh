#!/usr/bin/env bash
# ferry on one many-core host, loopback only (issue 37, "A 16-core host"): `ferry-bench --mode
# host` with its data in /dev/shm, so that what is measured is the cores and not a disk or a
# network. ferry's defaults (TLS, BLAKE3) and --no-encrypt, put and get, of one SIZE file,
# MANY files (64 x 64 MiB), the tiny tree (10,000 x 10 KiB) and a real tree (10,000 files, most
# under 16 KiB, a few over 8 MiB); GiB/s until durable, every copy verified, CPU seconds per GiB
# of the client and of the server; iperf3 -P 1/4/8 and `ferry probe net` on the same host as the
# ceilings; rsync's daemon beside it where installed. Estimated 4-5 minutes on 16 cores (not yet
# run on one); 1 minute here on 2 cores with the small sizes below.
#
# Build here, copy the two binaries and this script to the big host, run it there as any user
# (no root, no network beyond 127.0.0.1):
#
#   cargo build --release -p ferry-cli -p ferry-bench
#   bash scripts/host-bench.sh [FERRY_BIN [BENCH_BIN]]   # default target/release/{ferry,ferry-bench}
#   SIZE=256M MANY=16x16M TREES=2000x10K,real:2000 RUNS=1 bash scripts/host-bench.sh   # 2 cores
#
# Environment: SIZE (4G), MANY (64x64M), TREES (the other trees, "10000x10K,real:10000"; "none"),
# RUNS (3), WORK ("tmpfs", the default: /dev/shm; or a directory on a disk), OUT (default
# /tmp/host-bench; results go to $OUT/<UTC stamp>/), TIMEOUT (seconds for the whole bench, 600),
# EXTRA (more ferry-bench flags, e.g. "--transports tls"). Needs iperf3 for the host's ceiling
# (without it, the ceiling is left out and said so). Prints the results directory first and the
# summary table last; the directory holds summary.md, results.csv (one row per run) and logs/.
set -euo pipefail

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
}
[ $# -le 2 ] || usage
case "${1:-}" in -h | --help) usage ;; esac

ROOT=$(cd "$(dirname "$0")/.." && pwd)
FERRY=${1:-$ROOT/target/release/ferry}
BENCH=${2:-$ROOT/target/release/ferry-bench}
for b in "$FERRY" "$BENCH"; do
    [ -x "$b" ] || { echo "host-bench: $b: not an executable file (build with \`cargo build --release -p ferry-cli -p ferry-bench\`)" >&2; exit 2; }
done
FERRY=$(readlink -f "$FERRY")
BENCH=$(readlink -f "$BENCH")
SIZE=${SIZE:-4G}
MANY=${MANY:-64x64M}
TREES=${TREES:-10000x10K,real:10000}
RUNS=${RUNS:-3}
WORK=${WORK:-tmpfs}
TIMEOUT=${TIMEOUT:-600}
[[ "$RUNS" =~ ^[1-9][0-9]*$ ]] || { echo "host-bench: RUNS must be a positive integer" >&2; exit 2; }
[[ "$TIMEOUT" =~ ^[1-9][0-9]*$ ]] || { echo "host-bench: TIMEOUT must be seconds" >&2; exit 2; }
[[ "$MANY" =~ ^[0-9]+x[0-9]+[KMG]?$ ]] || { echo "host-bench: MANY must be like 64x64M" >&2; exit 2; }
command -v iperf3 >/dev/null || echo "host-bench: iperf3 is not installed: no host ceiling" >&2

trees=$MANY
[ "$TREES" = none ] || trees="$MANY,$TREES"
where=(--tmpfs)
[ "$WORK" = tmpfs ] || where=(--work "$WORK")
RES="${OUT:-/tmp/host-bench}/$(date -u +%Y%m%d-%H%M%S)"
mkdir -p "$RES"
echo "host-bench: results in $RES" >&2
echo "host-bench: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), load $(cut -d' ' -f1-3 /proc/loadavg)" >&2

rc=0
# shellcheck disable=SC2086 # EXTRA is split into flags on purpose.
timeout -k 20 "$TIMEOUT" "$BENCH" --mode host --ferry "$FERRY" --out "$RES" "${where[@]}" \
    --sizes "$SIZE" --trees "$trees" --runs "$RUNS" ${EXTRA:-} \
    >"$RES/summary.stdout" 2> >(tee "$RES/bench.log" >&2) || rc=$?
if [ "$rc" = 124 ]; then
    echo "host-bench: stopped after $TIMEOUT s (TIMEOUT); rows so far are in $RES/results.csv" >&2
fi
[ -s "$RES/summary.md" ] && cat "$RES/summary.md"
echo "host-bench: results in $RES (exit $rc)" >&2
exit "$rc"
