#!/bin/bash
# Tiny-tree put (10,000 x 10 KiB) on loopback to `ferry serve`, with and without the catalog,
# alternating ROUNDS times. Prints each put's seconds and the server's CPU seconds (user+sys).
# MODES (default "none catalog"): none = `--catalog none`, catalog = SQLite in the state
# directory, postgres = a throwaway PostgreSQL cluster under $W/pg (unix socket only, a fresh
# database each run; needs Debian's postgresql, run as root: the cluster runs as `postgres`).
set -e
FERRY=${FERRY:-target/debug/ferry}
ROUNDS=${ROUNDS:-3}
MODES=${MODES:-none catalog}
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
pgbin=
case " $MODES " in *" postgres "*)
  pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
  rm -rf $W/pg; mkdir -p $W/pg; chown postgres: $W/pg; chmod 755 $W
  as_pg() { setpriv --reuid=postgres --regid=postgres --clear-groups "$@"; }
  as_pg $pgbin/initdb -D $W/pg/data -U postgres -A trust -E UTF8 --locale=C >/dev/null
  as_pg $pgbin/pg_ctl -D $W/pg/data -l $W/pg/log -w \
    -o "-c listen_addresses='' -c unix_socket_directories=$W/pg" start >/dev/null
  trap "as_pg $pgbin/pg_ctl -D $W/pg/data -m fast stop >/dev/null" EXIT
;; esac
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
