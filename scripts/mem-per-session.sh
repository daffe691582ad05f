#!/usr/bin/env bash
# Peak memory of each end of one session against its stream count (issue 37: "memory per session
# bounded and stated"): loopback, tmpfs both ends, ferry's defaults (TLS, BLAKE3, 8 MiB blocks)
# with a fixed `--streams N`; a fresh `ferry serve` per case so its peak is that session's.
#
#   bash scripts/mem-per-session.sh BIN            # STREAMS="4 16 64" SIZE=2G ROUNDS=3
#
# Client: maximum resident set (/usr/bin/time %M). Server: VmHWM from /proc after the client
# exits, less its VmRSS before the transfer (what an idle server already holds). Output: a
# markdown table of medians on stdout; raw.csv in $OUT (default a new directory under /tmp).
set -euo pipefail
[ $# -eq 1 ] || { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
BIN=$(readlink -f "$1")
[ -x "$BIN" ] || { echo "mem-per-session: $1: not an executable file" >&2; exit 2; }
STREAMS=${STREAMS:-"4 16 64"}
SIZE=${SIZE:-2G}
ROUNDS=${ROUNDS:-3}
OUT=${OUT:-/tmp/mem-per-session/$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
WORK=$(mktemp -d /dev/shm/mem-per-session.XXXXXX)
SERVER_PID=""
cleanup() {
    [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT
kib() { awk -v k="$2" '$1 == k":" { print $2 }' "/proc/$1/status"; }
head -c "$(numfmt --from=iec "$SIZE")" /dev/urandom >"$WORK/src.bin"
echo "round,streams,direction,end,metric,kib" >"$OUT/raw.csv"

for round in $(seq "$ROUNDS"); do
    for n in $STREAMS; do
        for dir in put get; do
            lb="$WORK/lb"
            rm -rf "$lb"
            mkdir -p "$lb/root/src" "$lb/root/put-dest" "$lb/state" "$lb/cstate" "$lb/cfg" "$lb/get-dest"
            ln "$WORK/src.bin" "$lb/root/src/src.bin"
            port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
            FERRY_STATE_DIR="$lb/state" XDG_CONFIG_HOME="$lb/cfg" "$BIN" serve --root "$lb/root" \
                --listen "127.0.0.1:$port" --token-file "$lb/token" >"$lb/serve.log" 2>&1 &
            SERVER_PID=$!
            for _ in $(seq 150); do grep -q serving "$lb/serve.log" 2>/dev/null && break; sleep 0.1; done
            fp=$(grep -o 'sha256:[0-9a-f]*' "$lb/serve.log" | head -1)
            idle=$(kib "$SERVER_PID" VmRSS)
            if [ "$dir" = put ]; then
                args=(put "$WORK/src.bin" "127.0.0.1:$port:/put-dest/")
            else
                args=(get "127.0.0.1:$port:/src/src.bin" "$lb/get-dest/")
            fi
            FERRY_TOKEN=$(cat "$lb/token") FERRY_STATE_DIR="$lb/cstate" XDG_CONFIG_HOME="$lb/cfg" \
                /usr/bin/time -f "%M" -o "$lb/time" timeout 300 "$BIN" -q "${args[@]}" \
                --server-fingerprint "$fp" --streams "$n" >>"$OUT/client.log" 2>&1
            sleep 0.3
            peak=$(kib "$SERVER_PID" VmHWM)
            kill "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true; SERVER_PID=""
            echo "$round,$n,$dir,client,maxrss,$(cat "$lb/time")" >>"$OUT/raw.csv"
            echo "$round,$n,$dir,server,hwm_over_idle,$((peak - idle))" >>"$OUT/raw.csv"
        done
    done
done

python3 - "$OUT/raw.csv" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
cases = {}
for r in rows:
    cases.setdefault((int(r["streams"]), r["direction"], r["end"]), []).append(int(r["kib"]))
print("| streams | direction | client peak RSS (MiB) | server peak over idle (MiB) |")
print("|---|---|---|---|")
for n in sorted({k[0] for k in cases}):
    for d in ("put", "get"):
        c = statistics.median(cases[(n, d, "client")]) / 1024
        s = statistics.median(cases[(n, d, "server")]) / 1024
        print(f"| {n} | {d} | {c:.0f} | {s:.0f} |")
PY
echo "raw: $OUT/raw.csv" >&2
