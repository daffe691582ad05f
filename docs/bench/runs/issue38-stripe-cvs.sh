#!/usr/bin/env bash
# A striped 1 GiB put on loopback: three `ferry serve` sharing one tmpfs directory, the first
# coordinating. Prints each run's wall time and each server's CPU (utime+stime of its process).
# Usage: issue38-stripe-cvs.sh [RUNS]; FERRY_BIN picks the binary, BASE the tmpfs (/dev/shm).
set -euo pipefail
BIN=${FERRY_BIN:-$(cd "$(dirname "$0")/../../.." && pwd)/target/debug/ferry}
runs=${1:-3}
w=$(mktemp -d "${BASE:-/dev/shm}/stripecv.XXXX")
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null; rm -rf "$w"' EXIT
mkdir -p "$w/src" "$w/root" "$w/home"
head -c 1073741824 /dev/urandom > "$w/src/big.bin"
ports=()
for i in 0 1 2; do
  port=$((20000 + RANDOM % 20000))
  extra=(); [ "$i" -gt 0 ] && extra=(--stripe)
  mkdir -p "$w/state$i"
  FERRY_STATE_DIR=$w/state$i $BIN serve --root "$w/root" --listen 127.0.0.1:$port \
    --token-file "$w/tok" "${extra[@]}" 2>"$w/log$i" &
  pids+=($!); ports+=($port)
  for _ in $(seq 100); do grep -q serving "$w/log$i" 2>/dev/null && break; sleep 0.1; done
done
cpu() { awk '{print $14+$15}' "/proc/$1/stat"; }
for r in $(seq "$runs"); do
  c0=(); for p in "${pids[@]}"; do c0+=($(cpu "$p")); done
  t0=$(date +%s.%N)
  HOME=$w/home XDG_CONFIG_HOME=$w/home FERRY_STATE_DIR=$w/cstate FERRY_TOKEN=$(cat "$w/tok") \
    $BIN put -q --stripe "127.0.0.1:${ports[1]},127.0.0.1:${ports[2]}" "$w/src/big.bin" \
    "127.0.0.1:${ports[0]}:/r$r/" >/dev/null
  t1=$(date +%s.%N)
  c1=(); for p in "${pids[@]}"; do c1+=($(cpu "$p")); done
  cmp -s "$w/src/big.bin" "$w/root/r$r/big.bin" || { echo "run $r: copy differs"; exit 1; }
  printf 'run %s wall=%.2fs coordinator_cpu=%.2fs stripe_cpu=%.2fs,%.2fs\n' "$r" \
    "$(echo "$t1-$t0" | bc)" "$(echo "(${c1[0]}-${c0[0]})/100" | bc -l)" \
    "$(echo "(${c1[1]}-${c0[1]})/100" | bc -l)" "$(echo "(${c1[2]}-${c0[2]})/100" | bc -l)"
  rm -rf "$w/root/r$r"
done
