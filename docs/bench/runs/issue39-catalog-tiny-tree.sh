#!/bin/bash
# Tiny-tree put (10,000 x 10 KiB) on loopback to `ferry serve`, with and without the catalog,
# alternating ROUNDS times. Prints each put's seconds and the server's CPU seconds (user+sys).
set -e
FERRY=${FERRY:-target/debug/ferry}
ROUNDS=${ROUNDS:-3}
W=${W:-/tmp/ferry-catalog-bench}
rm -rf $W/src $W/state* $W/root* $W/home; mkdir -p $W/src $W/home
W=$W python3 - <<'PY'
import os
for i in range(10000):
    d=f"{os.environ['W']}/src/tree/d{i%100:02d}"
    os.makedirs(d,exist_ok=True)
    with open(f"{d}/f{i:05d}","wb") as f: f.write(os.urandom(10240))
PY
export HOME=$W/home XDG_CONFIG_HOME=$W/home/.config FERRY_NO_PROGRESS=1
port=17171
for mode in $(for r in $(seq $ROUNDS); do echo none catalog; done); do
  rm -rf $W/root $W/state; mkdir -p $W/root $W/state
  export FERRY_STATE_DIR=$W/state
  $FERRY serve --root $W/root --listen 127.0.0.1:$port --token-file $W/state/token --catalog $( [ $mode = none ] && echo none || echo $W/state/catalog.sqlite ) 2>$W/serve.log &
  pid=$!
  for i in $(seq 600); do grep -q serving $W/serve.log 2>/dev/null && [ -s $W/state/token ] && break; sleep 0.1; done
  t0=$(date +%s.%N)
  FERRY_TOKEN=$(cat $W/state/token) $FERRY put --quiet $W/src/tree 127.0.0.1:$port:/ >/dev/null 2>$W/put.err || { cat $W/put.err; }
  t1=$(date +%s.%N)
  n=$(find $W/root -type f | wc -l)
  cpu=$(awk -v hz=$(getconf CLK_TCK) '{printf "%.2f", ($14 + $15) / hz}' /proc/$pid/stat)
  echo "$mode $(echo "$t1 - $t0" | bc) files=$n server_cpu=$cpu"
  kill $pid; wait $pid 2>/dev/null || true
  port=$((port+1))
done
