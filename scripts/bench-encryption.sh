#!/usr/bin/env bash
# What TLS costs ferry: the same put with TLS (the default) and with plain TCP (--no-encrypt
# against `serve --allow-plaintext`), interleaved, median of N runs, with the CPU seconds of
# client and server. On loopback (tmpfs, so the disk is out of it) and, as root, across the
# emulated WAN bed (ferry-netem) at the given RTTs.
#
#   bash scripts/bench-encryption.sh                 # loopback, 1 GiB, 5 runs
#   bash scripts/bench-encryption.sh --bed 0,50      # also the 1 Gbit/s bed at 0 and 50 ms
#   SIZE_MIB=256 RUNS=3 bash scripts/bench-encryption.sh
set -euo pipefail
cd "$(dirname "$0")/.."

SIZE_MIB=${SIZE_MIB:-1024}
RUNS=${RUNS:-5}
BED_RTTS=""
[ "${1:-}" = "--bed" ] && BED_RTTS="${2:-0,50}"

cargo build --release -q -p ferry-cli -p ferry-netem
FERRY="$PWD/target/release/ferry"
NETEM="$PWD/target/release/ferry-netem"
WORK=$(mktemp -d /dev/shm/ferry-enc.XXXXXX)
SERVER_PID=""
cleanup() {
    [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null || true
    [ -n "$BED_RTTS" ] && "$NETEM" down --name fenc >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT

mkdir -p "$WORK/src" "$WORK/dst" "$WORK/state" "$WORK/cfg"
head -c "$((SIZE_MIB << 20))" /dev/urandom >"$WORK/src/big.bin"
export FERRY_STATE_DIR="$WORK/state" XDG_CONFIG_HOME="$WORK/cfg"

ticks() { # utime + stime of a pid, in clock ticks
    awk '{print $14 + $15}' "/proc/$1/stat"
}
HZ=$(getconf CLK_TCK)

# run_case LABEL ADDR [SERVER_NS CLIENT_NS]: starts a server (in SERVER_NS if given), then
# alternates TLS and plain puts from CLIENT_NS.
run_case() {
    local label=$1 addr=$2
    local res="$WORK/results-${label//[^A-Za-z0-9]/_}"
    local sprefix=() cprefix=()
    if [ -n "${3:-}" ]; then
        sprefix=(ip netns exec "$3")
        cprefix=(ip netns exec "$4")
    fi
    "${sprefix[@]}" "$FERRY" serve --root "$WORK/dst" --listen "$addr:7199" \
        --token-file "$WORK/token" --allow-plaintext 2>"$WORK/serve.log" &
    SERVER_PID=$!
    for _ in $(seq 100); do grep -q "serving" "$WORK/serve.log" 2>/dev/null && break; sleep 0.1; done
    local fp
    fp=$(grep -o 'sha256:[0-9a-f]*' "$WORK/serve.log" | head -1)
    local token
    token=$(cat "$WORK/token")
    : >"$res"
    for run in $(seq "$RUNS"); do
        for mode in tls plain; do
            rm -rf "${WORK:?}/dst/big.bin"
            sync
            local flag=(--server-fingerprint "$fp")
            [ "$mode" = plain ] && flag=(--no-encrypt)
            local s0 s1
            s0=$(ticks "$SERVER_PID")
            /usr/bin/time -f "%e %U %S" -o "$WORK/time" \
                "${cprefix[@]}" env FERRY_TOKEN="$token" "$FERRY" -q put "${flag[@]}" \
                "$WORK/src/big.bin" "$addr:7199:/" >/dev/null
            s1=$(ticks "$SERVER_PID")
            read -r wall user sys <"$WORK/time"
            echo "$mode $wall $user $sys $(awk "BEGIN{print ($s1 - $s0) / $HZ}")" >>"$res"
        done
    done
    kill "$SERVER_PID"
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=""
    python3 - "$label" "$SIZE_MIB" "$res" <<'EOF'
import statistics, sys
label, mib, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows = [l.split() for l in open(path)]
out = {}
for mode in ("tls", "plain"):
    r = [list(map(float, x[1:])) for x in rows if x[0] == mode]
    wall = statistics.median(x[0] for x in r)
    cli = statistics.median(x[1] + x[2] for x in r)
    srv = statistics.median(x[3] for x in r)
    out[mode] = (wall, cli, srv, [mib * 8 * 1.048576 / x[0] for x in r])
    gib = mib / 1024
    print(f"| {label} | {mode} | {mib*8*1.048576/wall:,.0f} Mbit/s ({min(out[mode][3]):,.0f}–{max(out[mode][3]):,.0f}) "
          f"| {cli/gib:.2f} | {srv/gib:.2f} |")
t, p = out["tls"], out["plain"]
print(f"| {label} | TLS/plain | {p[0]/t[0]:.2f}× throughput | {t[1]/max(p[1],1e-9):.2f}× | {t[2]/max(p[2],1e-9):.2f}× |")
EOF
}

echo "| path | mode | throughput, median of $RUNS (min–max) | client CPU s/GiB | server CPU s/GiB |"
echo "|---|---|---|---|---|"
run_case "loopback" 127.0.0.1
if [ -n "$BED_RTTS" ]; then
    IFS=, read -ra rtts <<<"$BED_RTTS"
    for rtt in "${rtts[@]}"; do
        "$NETEM" up --name fenc --rtt "${rtt}ms" --rate 1gbit >/dev/null
        run_case "1 Gbit/s, ${rtt} ms" 10.77.0.2 fenc-s fenc-c
        "$NETEM" down --name fenc >/dev/null
    done
fi
