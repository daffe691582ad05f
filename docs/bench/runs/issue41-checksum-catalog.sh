#!/usr/bin/env bash
# sync --checksum: first run and rerun, server CPU with the catalog's digests vs --catalog none.
set -euo pipefail
BIN=${FERRY_BIN:-$(cd "$(dirname "$0")/../../.." && pwd)/target/debug/ferry}
base=$1; cat=$2
w=$(mktemp -d "$base/b7.XXXX"); trap 'kill $srv 2>/dev/null; rm -rf "$w"' EXIT
mkdir -p "$w/src" "$w/root" "$w/state"
for i in $(seq 1 100); do head -c 2097152 /dev/urandom > "$w/src/f$i"; done
port=$((20000 + RANDOM % 20000))
FERRY_STATE_DIR=$w/state $BIN serve --root "$w/root" --listen 127.0.0.1:$port --token-file "$w/tok" --catalog "$cat" 2>"$w/log" & srv=$!
for _ in $(seq 50); do grep -q serving "$w/log" 2>/dev/null && break; sleep 0.1; done
cpu() { awk '{print $14+$15}' /proc/$srv/stat; }
run() { local c0=$(cpu) t0=$(date +%s.%N); FERRY_STATE_DIR=$w/cstate FERRY_TOKEN=$(cat $w/tok) $BIN sync -q --checksum "$w/src" 127.0.0.1:$port:/m >/dev/null 2>&1 || true; local t1=$(date +%s.%N) c1=$(cpu); printf '%s %s wall=%.2fs servercpu=%.2fs\n' "$cat" "$1" "$(echo "$t1-$t0"|bc)" "$(echo "($c1-$c0)/100"|bc -l)"; }
run first; sleep 1; run rerun1; run rerun2
