#!/bin/bash
# Where a PostgreSQL catalog's time goes on the tiny-tree put (10,000 x 10 KiB on loopback):
# one put per round into `ferry serve --catalog <throwaway cluster>`, with PostgreSQL's own
# counters (pg_stat_statements: calls, rows and time per statement; pg_stat_wal: WAL syncs and
# their time; xact_commit), PostgreSQL's CPU (its processes, the backends reaped included) and
# the server's CPU per thread (`ferry-finalize` alive after the put is the catalog's registering
# thread, spawned from the finalizer). With STRACE=1 the server runs under strace for its
# syncfs/fsync calls (count and time: the finalizer's batches). Run as root.
set -e
. "$(dirname "$0")/catalog-bench-lib.sh"
FERRY=${FERRY:-target/release/ferry}
ROUNDS=${ROUNDS:-1}
W=${W:-/tmp/ferry-pg-where}
rm -rf $W/src $W/state* $W/root* $W/home; mkdir -p $W/src $W/home
tiny_tree $W
export HOME=$W/home XDG_CONFIG_HOME=$W/home/.config FERRY_NO_PROGRESS=1
pg_start $W -c shared_preload_libraries=pg_stat_statements -c track_wal_io_timing=on \
  -c pg_stat_statements.track_utility=on
psql() { as_pg $pgbin/psql -q -h $W/pg -U postgres "$@"; }
pgcpu() { # ticks of every postgres process, plus what the postmaster reaped
  local pm=$(head -1 $W/pg/data/postmaster.pid) t=0
  for p in $(pgrep -u postgres); do t=$((t + $(awk '{print $14+$15}' /proc/$p/stat 2>/dev/null || echo 0))); done
  echo $((t + $(awk '{print $16+$17}' /proc/$pm/stat)))
}
port=17271
for r in $(seq $ROUNDS); do
  rm -rf $W/root $W/state; mkdir -p $W/root $W/state; sync
  export FERRY_STATE_DIR=$W/state
  psql -d postgres -c 'drop database if exists bench' -c 'create database bench' >/dev/null
  psql -d bench -c 'create extension pg_stat_statements' -c 'select pg_stat_statements_reset()' -c "select pg_stat_reset_shared('wal')" >/dev/null
  catalog="host=$W/pg user=postgres dbname=bench"
  pre=
  [ "$STRACE" = 1 ] && pre="strace -f --seccomp-bpf -T -e trace=syncfs,fsync -o $W/strace.out"
  $pre $FERRY serve --root $W/root --listen 127.0.0.1:$port --token-file $W/state/token --catalog "$catalog" 2>$W/serve.log &
  for i in $(seq 600); do grep -q serving $W/serve.log 2>/dev/null && [ -s $W/state/token ] && break; sleep 0.1; done
  pid=$!
  [ "$STRACE" = 1 ] && pid=$(pgrep -P $pid)
  c0=$(pgcpu); t0=$(date +%s.%N)
  FERRY_TOKEN=$(cat $W/state/token) $FERRY put --quiet $W/src/tree 127.0.0.1:$port:/ >/dev/null 2>$W/put.err || cat $W/put.err
  t1=$(date +%s.%N)
  sleep 1 # the registering thread catches up
  c1=$(pgcpu); hz=$(getconf CLK_TCK)
  echo "round $r put $(echo "$t1 - $t0" | bc) s; postgres cpu $(echo "scale=2; ($c1 - $c0) / $hz" | bc) s; files $(find $W/root -type f | wc -l)"
  echo "server threads (comm: user+sys s):"
  for t in /proc/$pid/task/*; do echo "$(cat $t/comm) $(awk -v hz=$hz '{printf "%.2f", ($14+$15)/hz}' $t/stat)"; done \
    | awk '{s[$1]+=$2; n[$1]++} END {for (k in s) printf "  %s x%d: %.2f\n", k, n[k], s[k]}' | sort
  psql -d bench -At -F ' | ' -c "select calls, rows, round(total_exec_time::numeric,1) as ms, left(regexp_replace(query, '\s+', ' ', 'g'), 70) from pg_stat_statements order by total_exec_time desc limit 12"
  psql -d bench -At -F ' | ' -c "select 'wal', wal_records, wal_write, wal_sync, round(wal_write_time::numeric,1), round(wal_sync_time::numeric,1) from pg_stat_wal" \
    -c "select 'commits', xact_commit from pg_stat_database where datname = 'bench'"
  kill $pid; wait $! 2>/dev/null || true
  if [ "$STRACE" = 1 ]; then
    awk '/syncfs\(/ {n++; gsub(/[<>]/,"",$NF); t+=$NF} /fsync\(/ {m++} END {printf "syncfs %d calls %.3f s; fsync %d\n", n, t, m}' $W/strace.out
  fi
  port=$((port+1))
done
