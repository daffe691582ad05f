#!/usr/bin/env bash
# Before/after speed check of two ferry binaries (issue 36: "no change beyond noise"). Absolute
# timings on a shared machine drift from one minute to the next, so both binaries run in ONE
# invocation, alternating round by round (before first in odd rounds, after first in even ones),
# and the table compares their medians.
#
# Each round, for each binary:
#   - the bench's targets on the emulated 1 Gbit/s bed (ferry-bench, ferry's defaults, put,
#     default regime, tmpfs both ends, one run): 1 GiB at 0/50/100 ms and 10,000 x 10 KiB at
#     100 ms (after the 1 GiB on the same link, as in `--targets`), without iperf3 (the ceiling
#     is not what is compared) and without the bench's warm-up transfers (they would take a
#     third of the time; WARMUP=1 keeps them), so each link's first put meets a fresh server
#     for both binaries alike;
#   - on loopback (no bed): `ferry serve` on 127.0.0.1, a 1 GiB put and a 1 GiB get, tmpfs both
#     ends, wall time and the CPU seconds (user + sys) of the client and of the server.
#
#   bash scripts/bench-ab.sh BEFORE_BIN AFTER_BIN [ROUNDS]          # ROUNDS default 3
#   SIZE=100M TREE=1000x10K bash scripts/bench-ab.sh A B 1          # a small trial
#
# Environment: OUT (default /tmp/bench-ab; results go to $OUT/<UTC stamp>/), SIZE (1G), TREE
# (10000x10K), RTTS (0,50,100), TREE_RTT (100), BENCH (the ferry-bench binary, default
# target/release/ferry-bench), BENCH_TIMEOUT (s per ferry-bench invocation, 300), RUN_TIMEOUT
# (s per transfer, 120), WARMUP (0; 1: the bench's warm-up transfers). Needs root (network
# namespaces), python3, /usr/bin/time; 3 rounds take about 10-14 minutes on this 2-core machine.
# Output: the markdown table on stdout and in table.md; raw.csv (one row per round, binary, case
# and metric); each ferry-bench invocation's own directory (results.csv, logs/).
set -euo pipefail

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
}
[ $# -ge 2 ] && [ $# -le 3 ] || usage
cd "$(dirname "$0")/.."

BEFORE=$(readlink -f "$1")
AFTER=$(readlink -f "$2")
ROUNDS=${3:-3}
SIZE=${SIZE:-1G}
TREE=${TREE:-10000x10K}
RTTS=${RTTS:-0,50,100}
TREE_RTT=${TREE_RTT:-100}
BENCH=${BENCH:-target/release/ferry-bench}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-300}
RUN_TIMEOUT=${RUN_TIMEOUT:-120}
WARMUP_FLAG=(--no-warmup)
[ "${WARMUP:-0}" = 1 ] && WARMUP_FLAG=()
for b in "$BEFORE" "$AFTER" "$BENCH"; do
    [ -x "$b" ] || { echo "bench-ab: $b: not an executable file" >&2; exit 2; }
done
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || { echo "bench-ab: ROUNDS must be a positive integer" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "bench-ab: needs root (the bed's network namespaces)" >&2; exit 2; }
for t in python3 /usr/bin/time ip cmp; do
    command -v "$t" >/dev/null || { echo "bench-ab: $t is not installed" >&2; exit 2; }
done
BENCH=$(readlink -f "$BENCH")

# SIZE in bytes: a number with an optional binary K/M/G suffix (what ferry-bench's --sizes takes).
bytes_of() {
    local n=${1%[KkMmGg]*} u=${1##*[0-9]}
    [[ "$n" =~ ^[0-9]+$ ]] || { echo "bench-ab: SIZE $1: expected e.g. 1G, 100M" >&2; exit 2; }
    case "$u" in
    "") echo "$n" ;;
    K | k) echo $((n << 10)) ;;
    M | m) echo $((n << 20)) ;;
    G | g) echo $((n << 30)) ;;
    *) echo "bench-ab: SIZE $1: unit must be K, M or G" >&2; exit 2 ;;
    esac
}
SIZE_BYTES=$(bytes_of "$SIZE")

STAMP=$(date -u +%Y%m%d-%H%M%S)
RES="${OUT:-/tmp/bench-ab}/$STAMP"
mkdir -p "$RES"
RES=$(readlink -f "$RES")
WORK=$(mktemp -d /dev/shm/bench-ab.XXXXXX)
RAW="$RES/raw.csv"
echo "round,slot,binary,case,metric,value,ok,detail" >"$RAW"
T0=$SECONDS
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)

# Cleanup: only what this script started, by pid. CHILD is the ferry-bench or client in flight,
# SERVER_PID the loopback server.
CHILD=""
SERVER_PID=""
# stop_pid PID: TERM to it and its direct children (a client's `timeout` passes it on to ferry),
# up to 20 s to clean up (ferry-bench removes its bed), then KILL.
stop_pid() {
    local p=$1 kids i
    kill -0 "$p" 2>/dev/null || { wait "$p" 2>/dev/null || true; return 0; }
    kids=$(ps -o pid= --ppid "$p" 2>/dev/null || true)
    # shellcheck disable=SC2086
    kill -TERM "$p" $kids 2>/dev/null || true
    for i in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
    # shellcheck disable=SC2086
    kill -KILL "$p" $kids 2>/dev/null || true
    wait "$p" 2>/dev/null || true
}
# reap_bed PID: the namespaces fnm-PID-<n>-{c,s} of a ferry-bench that had to be killed, with the
# processes it started in them, and its /etc/netns and /dev/shm leftovers.
reap_bed() {
    local p=$1 ns q
    for ns in $(ip netns list 2>/dev/null | awk -v pre="fnm-$p-" 'index($1, pre) == 1 {print $1}'); do
        for q in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$q" 2>/dev/null || true; done
        ip netns del "$ns" 2>/dev/null || true
    done
    rm -rf "/etc/netns/fnm-$p-"* "/dev/shm/ferry-bench-$p"
}
# stop_child: stops CHILD, and its bed if it is a ferry-bench.
CHILD_IS_BENCH=false
stop_child() {
    [ -n "$CHILD" ] || return 0
    stop_pid "$CHILD"
    if $CHILD_IS_BENCH; then reap_bed "$CHILD"; fi
    CHILD=""
}
cleanup() {
    local rc=$?
    trap - EXIT INT TERM HUP
    stop_child
    [ -n "$SERVER_PID" ] && stop_pid "$SERVER_PID"
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP

# Progress goes to the terminal's stderr (fd 3), also from steps whose output goes to a log.
exec 3>&2
log() { printf 'bench-ab [%4ds]: %s\n' "$((SECONDS - T0))" "$*" >&3; }

# run_bounded SECS CMD...: CMD in the background (so that a signal reaches the trap at once),
# stopped after SECS. Returns CMD's status, 124 on timeout.
run_bounded() {
    local secs=$1 deadline=$((SECONDS + $1)) rc=0
    shift
    CHILD_IS_BENCH=false
    [ "$1" = "$BENCH" ] && CHILD_IS_BENCH=true
    "$@" </dev/null &
    CHILD=$!
    while kill -0 "$CHILD" 2>/dev/null; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            log "timeout after ${secs}s: $*"
            stop_child
            return 124
        fi
        sleep 0.2
    done
    wait "$CHILD" || rc=$?
    CHILD=""
    return "$rc"
}

# --- the bed: ferry-bench, two invocations per binary (the tree's RTT alone, as --targets) ---

bed_invocations() { # one "RTTS TREES" line per ferry-bench invocation
    local others
    others=$(tr ',' '\n' <<<"$RTTS" | grep -vx "$TREE_RTT" | paste -sd, || true)
    [ -n "$others" ] && echo "$others none"
    echo "$TREE_RTT $TREE"
}

# bed ROUND SLOT LABEL BIN: appends ferry's rows of each invocation to raw.csv.
bed() {
    local round=$1 slot=$2 label=$3 bin=$4 rtts trees dir i=0 rc line
    local lines
    mapfile -t lines < <(bed_invocations)
    for line in "${lines[@]}"; do
        read -r rtts trees <<<"$line"
        i=$((i + 1))
        dir="$RES/bed-r$round-$label-$i"
        log "round $round, $label: ferry-bench --rtt $rtts --sizes $SIZE --trees $trees"
        rc=0
        run_bounded "$BENCH_TIMEOUT" "$BENCH" --ferry "$bin" --rtt "$rtts" --rate 1gbit \
            --regime default --direction put --sizes "$SIZE" --trees "$trees" --streams 0 \
            --block-sizes default --peers none --no-iperf3 --runs 1 --max-run-secs "$RUN_TIMEOUT" \
            "${WARMUP_FLAG[@]}" --work "$WORK/bed" --out "$dir" >"$dir.log" 2>&1 || rc=$?
        if [ "$rc" != 0 ]; then
            log "ferry-bench exited $rc (see $dir.log)"
            echo "$round,$slot,$label,bed $rtts ms,error,,false,ferry-bench exited $rc" >>"$RAW"
        fi
        [ -f "$dir/results.csv" ] || continue
        python3 - "$dir/results.csv" "$round" "$slot" "$label" "$rtts" >>"$RAW" <<'EOF'
import csv, sys
path, rnd, slot, label, rtts = sys.argv[1:]
rows = [r for r in csv.DictReader(open(path)) if r["tool"] == "ferry"]
if not rows:  # a link that failed is only a note in ferry-bench's summary
    print(f"{rnd},{slot},{label},bed {rtts} ms,error,,false,no ferry rows (see the log)")
for r in rows:
    ok = r["verified"] == "true" and not r["error"]
    case = f'{r["direction"]} {r["dataset"]} {r["rtt_ms"]} ms'
    secs = float(r["wall_s"] or 0) + float(r["sync_s"] or 0)
    detail = r["error"].replace(",", ";").replace("\n", " ")
    for metric, v in (("Mbit/s", r["mbps"]), ("s", f"{secs:.4f}")):
        print(f'{rnd},{slot},{label},{case},{metric},{v},{str(ok).lower()},{detail}')
EOF
    done
}

# --- loopback: one server per binary and round, a put and a get ---

ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
HZ=$(getconf CLK_TCK)

# lb_case ROUND SLOT LABEL BIN put|get PORT FINGERPRINT TOKEN DIR: one transfer, timed, with the
# CPU seconds of both ends (the client's from /usr/bin/time, the server's from /proc).
lb_case() {
    local round=$1 slot=$2 label=$3 bin=$4 dir=$5 port=$6 fp=$7 token=$8 lb=$9
    local src dst s0 s1 rc=0 wall user sys ok=false case="loopback $dir $SIZE"
    rm -rf "$lb/root/put-dest" "$lb/get-dest"
    mkdir -p "$lb/root/put-dest" "$lb/get-dest"
    timeout 60 sync || true
    local args=(put "$WORK/src.bin" "127.0.0.1:$port:/put-dest/")
    src="$WORK/src.bin" dst="$lb/root/put-dest/src.bin"
    if [ "$dir" = get ]; then
        args=(get "127.0.0.1:$port:/src/src.bin" "$lb/get-dest/")
        dst="$lb/get-dest/src.bin"
    fi
    rm -f "$lb/time"
    s0=$(ticks "$SERVER_PID")
    FERRY_TOKEN=$token run_bounded $((RUN_TIMEOUT + 10)) /usr/bin/time -f "%e %U %S" -o "$lb/time" \
        timeout -k 5 "$RUN_TIMEOUT" "$bin" -q "${args[@]}" --server-fingerprint "$fp" \
        >>"$lb/client.log" 2>&1 || rc=$?
    # The server finishes its side (a get's last acknowledgements) just after the client exits.
    sleep 0.3
    s1=$(ticks "$SERVER_PID")
    if [ "$rc" = 0 ] && kill -0 "$SERVER_PID" 2>/dev/null && cmp -s "$src" "$dst"; then ok=true; fi
    wall=0 user=0 sys=0
    read -r wall user sys < <(tail -1 "$lb/time" 2>/dev/null) || true
    [[ "$wall $user $sys" =~ ^[0-9.]+\ [0-9.]+\ [0-9.]+$ ]] || { wall=0 user=0 sys=0 ok=false; }
    python3 - "$round" "$slot" "$label" "$case" "$SIZE_BYTES" "$wall" "$user" "$sys" \
        "$(((s1 - s0)))" "$HZ" "$ok" "exit $rc" >>"$RAW" <<'EOF'
import sys
rnd, slot, label, case, size, wall, user, sys_, sticks, hz, ok, detail = sys.argv[1:]
size, wall, gib = int(size), float(wall), int(size) / 2**30
ok = ok == "true"
print(f"{rnd},{slot},{label},{case},Mbit/s,{size * 8 / wall / 1e6 if wall > 0 else ''},{str(ok).lower()},{detail}")
print(f"{rnd},{slot},{label},{case},s,{wall},{str(ok).lower()},{detail}")
print(f"{rnd},{slot},{label},{case},client CPU s/GiB,{(float(user) + float(sys_)) / gib:.4f},{str(ok).lower()},{detail}")
print(f"{rnd},{slot},{label},{case},server CPU s/GiB,{int(sticks) / int(hz) / gib:.4f},{str(ok).lower()},{detail}")
EOF
}

loopback() {
    local round=$1 slot=$2 label=$3 bin=$4 lb="$WORK/lb-$round-$label" port fp token i
    mkdir -p "$lb/root/src" "$lb/state" "$lb/cstate" "$lb/cfg"
    ln "$WORK/src.bin" "$lb/root/src/src.bin"
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    # Fresh state (the server's TLS key; the client's profiles and remembered paths) and config
    # for each binary and round, so nothing carries over; the client pins the key printed.
    FERRY_STATE_DIR="$lb/state" XDG_CONFIG_HOME="$lb/cfg" FERRY_KNOWN_HOSTS="$lb/cfg/known_hosts" \
        "$bin" serve --root "$lb/root" --listen "127.0.0.1:$port" --token-file "$lb/token" \
        >"$lb/serve.log" 2>&1 &
    SERVER_PID=$!
    for i in $(seq 150); do
        grep -q "serving" "$lb/serve.log" 2>/dev/null || ! kill -0 "$SERVER_PID" 2>/dev/null && break
        sleep 0.1
    done
    fp=$(grep -o 'sha256:[0-9a-f]*' "$lb/serve.log" | head -1 || true)
    if [ -z "$fp" ] || ! kill -0 "$SERVER_PID" 2>/dev/null; then
        log "round $round, $label: loopback server did not start: $(tail -3 "$lb/serve.log")"
        echo "$round,$slot,$label,loopback,error,,false,server did not start" >>"$RAW"
        stop_pid "$SERVER_PID"
        SERVER_PID=""
        return
    fi
    token=$(cat "$lb/token")
    for dir in put get; do
        log "round $round, $label: loopback $dir $SIZE"
        FERRY_STATE_DIR="$lb/cstate" XDG_CONFIG_HOME="$lb/cfg" FERRY_KNOWN_HOSTS="$lb/cfg/known_hosts" \
            lb_case "$round" "$slot" "$label" "$bin" "$dir" "$port" "$fp" "$token" "$lb"
    done
    stop_pid "$SERVER_PID"
    SERVER_PID=""
    cp "$lb/serve.log" "$RES/serve-r$round-$label.log"
    [ -s "$lb/client.log" ] && cp "$lb/client.log" "$RES/client-r$round-$label.log"
    rm -rf "$lb"
}

# --- the run ---

log "before=$BEFORE after=$AFTER rounds=$ROUNDS size=$SIZE tree=$TREE results=$RES"
log "generating $SIZE for loopback in $WORK"
head -c "$SIZE_BYTES" /dev/urandom >"$WORK/src.bin"
mkdir -p "$WORK/bed"
for round in $(seq "$ROUNDS"); do
    order=(before after)
    [ $((round % 2)) = 0 ] && order=(after before)
    slot=0
    for label in "${order[@]}"; do
        slot=$((slot + 1))
        bin=$BEFORE
        [ "$label" = after ] && bin=$AFTER
        bed "$round" "$slot" "$label" "$bin"
        loopback "$round" "$slot" "$label" "$bin"
    done
done
ELAPSED=$((SECONDS - T0))

{
    echo "# ferry before/after ($(date -u '+%Y-%m-%d %H:%M UTC'), $ROUNDS rounds, ${ELAPSED}s)"
    echo
    printf 'Command: `SIZE=%s TREE=%s RTTS=%s TREE_RTT=%s WARMUP=%s bash scripts/bench-ab.sh %s %s %s`\n' \
        "$SIZE" "$TREE" "$RTTS" "$TREE_RTT" "${WARMUP:-0}" "$BEFORE" "$AFTER" "$ROUNDS"
    echo
    echo "- before: \`$BEFORE\` (sha256 $(sha256sum "$BEFORE" | cut -c1-16))"
    echo "- after: \`$AFTER\` (sha256 $(sha256sum "$AFTER" | cut -c1-16))"
    echo "- harness: \`$BENCH\`; $(nproc) cores; load average at start $LOAD0, at end" \
        "$(cut -d' ' -f1-3 /proc/loadavg)"
    echo "- bed: emulated 1 Gbit/s, default regime, put, ferry's defaults, tmpfs, one run per" \
        "round, Mbit/s until durable; loopback: 127.0.0.1, tmpfs; CPU: user + sys per GiB moved"
    echo
    python3 - "$RAW" <<'EOF'
import csv, statistics, sys
rows = [r for r in csv.DictReader(open(sys.argv[1]))]
keys, vals, bad = [], {}, {}
for r in rows:
    k = (r["case"], r["metric"])
    if k not in keys and r["metric"] != "error":
        keys.append(k)
    if r["ok"] == "true" and r["value"]:
        vals.setdefault((k, r["binary"]), []).append(float(r["value"]))
    else:
        bad[(k, r["binary"])] = bad.get((k, r["binary"]), 0) + 1
# The table shows throughput for one file, seconds for a tree, and every loopback metric.
def shown(case, metric):
    if case.startswith("loopback"):
        return metric != "s"
    tree = "x" in case.split()[1]
    return metric == ("s" if tree else "Mbit/s")
def cell(k, b):
    v = vals.get((k, b), [])
    if not v:
        return None, "—"
    m = statistics.median(v)
    fmt = (lambda x: f"{x:.0f}") if k[1] == "Mbit/s" else (lambda x: f"{x:.3f}" if x < 10 else f"{x:.2f}")
    s = fmt(m) + (f" ({fmt(min(v))}–{fmt(max(v))})" if len(v) > 1 else "")
    if bad.get((k, b)):
        s += f", {bad[(k, b)]} failed"
    return m, s
print("| case | metric | before: median (min–max) | after: median (min–max) | after/before |")
print("|---|---|---|---|---|")
for k in keys:
    if not shown(*k):
        continue
    mb, sb = cell(k, "before")
    ma, sa = cell(k, "after")
    ratio = f"{ma / mb:.3f}" if mb and ma is not None else "—"
    better = "higher is better" if k[1] == "Mbit/s" else "lower is better"
    print(f"| {k[0]} | {k[1]} ({better}) | {sb} | {sa} | {ratio} |")
failed = sum(1 for r in rows if r["ok"] != "true")
if failed:
    print(f"\n{failed} raw rows failed or timed out: see raw.csv (detail column) and the logs.")
EOF
} | tee "$RES/table.md"
log "done in ${ELAPSED}s: $RES/{table.md,raw.csv}"
