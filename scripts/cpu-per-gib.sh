#!/usr/bin/env bash
# CPU seconds per GiB of each end, loopback, tmpfs both ends (issue 37's 2-core baseline): for
# each ferry binary given, a `ferry serve` on 127.0.0.1 and ROUNDS puts and gets of one file,
# with TLS (ferry's defaults) and with --no-encrypt; binaries alternate round by round so that
# the machine's drift hits them alike. Medians per binary, case and end.
#
#   bash scripts/cpu-per-gib.sh BIN [BIN2 ...]          # ROUNDS=5 SIZE=1G
#
# Client CPU: user + sys of the client (/usr/bin/time); server CPU: utime + stime of the server
# process from /proc, read before the transfer and 0.3 s after the client exits (a get's last
# acknowledgements). Output: a markdown table on stdout; raw.csv in $OUT (default a new
# directory under /tmp/cpu-per-gib).
set -euo pipefail
[ $# -ge 1 ] || { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
ROUNDS=${ROUNDS:-5}
SIZE=${SIZE:-1G}
BINS=()
for b in "$@"; do
    [ -x "$b" ] || { echo "cpu-per-gib: $b: not an executable file" >&2; exit 2; }
    BINS+=("$(readlink -f "$b")")
done
OUT=${OUT:-/tmp/cpu-per-gib/$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
WORK=$(mktemp -d /dev/shm/cpu-per-gib.XXXXXX)
SERVER_PID=""
cleanup() {
    [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT
HZ=$(getconf CLK_TCK)
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
python3 -c "
import os, sys
n = {'K': 1 << 10, 'M': 1 << 20, 'G': 1 << 30}
s = sys.argv[1]
size = int(s[:-1]) * n[s[-1]] if s[-1] in n else int(s)
with open(sys.argv[2], 'wb') as f:
    left = size
    while left:
        k = min(left, 8 << 20)
        f.write(os.urandom(k))
        left -= k
" "$SIZE" "$WORK/src.bin"
BYTES=$(stat -c %s "$WORK/src.bin")
echo "round,binary,case,metric,value" >"$OUT/raw.csv"

# one BIN LABEL ROUND: a server for this binary, then put and get, TLS and plain.
one() {
    local bin=$1 label=$2 round=$3 lb="$WORK/lb" port fp token i mode dir extra s0 s1 wall user sys
    rm -rf "$lb"
    mkdir -p "$lb/root/src" "$lb/state" "$lb/cstate" "$lb/cfg"
    ln "$WORK/src.bin" "$lb/root/src/src.bin"
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    FERRY_STATE_DIR="$lb/state" XDG_CONFIG_HOME="$lb/cfg" "$bin" serve --root "$lb/root" \
        --listen "127.0.0.1:$port" --token-file "$lb/token" --allow-plaintext >"$lb/serve.log" 2>&1 &
    SERVER_PID=$!
    for i in $(seq 150); do grep -q serving "$lb/serve.log" 2>/dev/null && break; sleep 0.1; done
    fp=$(grep -o 'sha256:[0-9a-f]*' "$lb/serve.log" | head -1)
    token=$(cat "$lb/token")
    for mode in tls plain; do
        extra=(--server-fingerprint "$fp")
        [ "$mode" = plain ] && extra=(--no-encrypt)
        for dir in put get; do
            rm -rf "$lb/root/put-dest" "$lb/get-dest"
            mkdir -p "$lb/root/put-dest" "$lb/get-dest"
            if [ "$dir" = put ]; then
                args=(put "$WORK/src.bin" "127.0.0.1:$port:/put-dest/")
                dst="$lb/root/put-dest/src.bin"
            else
                args=(get "127.0.0.1:$port:/src/src.bin" "$lb/get-dest/")
                dst="$lb/get-dest/src.bin"
            fi
            s0=$(ticks "$SERVER_PID")
            FERRY_TOKEN=$token FERRY_STATE_DIR="$lb/cstate" XDG_CONFIG_HOME="$lb/cfg" \
                FERRY_KNOWN_HOSTS="$lb/cfg/known_hosts" /usr/bin/time -f "%e %U %S" -o "$lb/time" \
                timeout 120 "$bin" -q "${args[@]}" "${extra[@]}" \
                >>"$OUT/client.log" 2>&1
            sleep 0.3
            s1=$(ticks "$SERVER_PID")
            cmp -s "$WORK/src.bin" "$dst" || { echo "cpu-per-gib: $label $dir $mode: copy differs" >&2; exit 1; }
            read -r wall user sys <"$lb/time"
            python3 - "$round" "$label" "$dir $mode" "$BYTES" "$wall" "$user" "$sys" "$((s1 - s0))" "$HZ" >>"$OUT/raw.csv" <<'EOF'
import sys
rnd, label, case, size, wall, user, sys_, st, hz = sys.argv[1:]
gib = int(size) / 2**30
print(f"{rnd},{label},{case},GiB/s,{gib / float(wall):.3f}")
print(f"{rnd},{label},{case},client s/GiB,{(float(user) + float(sys_)) / gib:.3f}")
print(f"{rnd},{label},{case},server s/GiB,{int(st) / int(hz) / gib:.3f}")
print(f"{rnd},{label},{case},total s/GiB,{(float(user) + float(sys_) + int(st) / int(hz)) / gib:.3f}")
EOF
            echo "cpu-per-gib: round $round $label $dir $mode done" >&2
        done
    done
    kill "$SERVER_PID"
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=""
}

for round in $(seq "$ROUNDS"); do
    n=${#BINS[@]}
    for k in $(seq 0 $((n - 1))); do
        i=$(((k + round) % n))
        one "${BINS[$i]}" "bin$((i + 1))" "$round"
    done
done

{
    echo "# CPU seconds per GiB, loopback, tmpfs ($(date -u '+%Y-%m-%d %H:%M UTC'), $ROUNDS rounds, $SIZE, $(nproc) cores)"
    echo
    for i in "${!BINS[@]}"; do echo "- bin$((i + 1)): \`${BINS[$i]}\`"; done
    echo
    python3 - "$OUT/raw.csv" <<'EOF'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
bins = sorted({r["binary"] for r in rows})
cases = list(dict.fromkeys(r["case"] for r in rows))
metrics = list(dict.fromkeys(r["metric"] for r in rows))
print("| case | metric | " + " | ".join(bins) + " |")
print("|---|---|" + "---|" * len(bins))
for c in cases:
    for m in metrics:
        cells = []
        for b in bins:
            v = [float(r["value"]) for r in rows if (r["case"], r["metric"], r["binary"]) == (c, m, b)]
            cells.append(f"{statistics.median(v):.3f} ({min(v):.2f}-{max(v):.2f})" if v else "")
        print(f"| {c} | {m} | " + " | ".join(cells) + " |")
EOF
} | tee "$OUT/table.md"
