#!/bin/bash
# Tiny-tree put (10,000 x 10 KiB) on loopback to `ferry serve`, with and without the catalog,
# alternating ROUNDS times. Prints each put's seconds and the server's CPU seconds (user+sys).
# MODES (default "none catalog"): none = `--catalog none`, catalog = SQLite in the state
# directory, postgres = a throwaway PostgreSQL cluster under $W/pg (unix socket only, a fresh
# database each run; needs Debian's postgresql, run as root: the cluster runs as `postgres`).
set -e
. "$(dirname "$0")/catalog-bench-lib.sh"
FERRY=${FERRY:-target/debug/ferry}
ROUNDS=${ROUNDS:-3}
MODES=${MODES:-none catalog}
W=${W:-/tmp/ferry-catalog-bench}
rm -rf $W/src $W/state* $W/root* $W/home; mkdir -p $W/src $W/home
tiny_tree $W
export HOME=$W/home XDG_CONFIG_HOME=$W/home/.config FERRY_NO_PROGRESS=1
case " $MODES " in *" postgres "*) pg_start $W ;; esac
port=17171
for mode in $(for r in $(seq $ROUNDS); do echo $MODES; done); do
  rm -rf $W/root $W/state; mkdir -p $W/root $W/state
  # The last run's writes and deletes flushed now, not in this run's syncfs.
  sync
  export FERRY_STATE_DIR=$W/state
  case $mode in
    none) catalog=none ;;
    catalog) catalog=$W/state/catalog.sqlite ;;
    postgres)
      as_pg $pgbin/psql -q -h $W/pg -U postgres -d postgres \
        -c 'drop database if exists bench' -c 'create database bench' >/dev/null
      catalog="host=$W/pg user=postgres dbname=bench" ;;
  esac
  $FERRY serve --root $W/root --listen 127.0.0.1:$port --token-file $W/state/token --catalog "$catalog" 2>$W/serve.log &
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
