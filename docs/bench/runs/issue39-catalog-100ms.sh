#!/bin/bash
# The catalog's cost on the tiny-tree put (10,000 x 10 KiB) over the emulated 1 Gbit/s link at
# RTT (default 100 ms), into ext4 (the bench's --work): the bed's server without a catalog, with
# SQLite (serve's default) and with PostgreSQL (a throwaway cluster under $W/pg, reached over its
# unix socket from the server's namespace), ROUNDS rounds of the three in turn, one recorded run
# each after the bench's warm-up. Prints each run's wall time; medians by mode at the end.
set -e
. "$(dirname "$0")/catalog-bench-lib.sh"
BENCH=${BENCH:-target/release/ferry-bench}
FERRY=${FERRY:-target/release/ferry}
ROUNDS=${ROUNDS:-3}
RTT=${RTT:-100}
MODES=${MODES:-none sqlite postgres}
W=${W:-/tmp/ferry-catalog-100ms}
mkdir -p "$W"; W=$(realpath "$W")
case " $MODES " in *" postgres "*) pg_start "$W" ;; esac
for r in $(seq "$ROUNDS"); do
  for mode in $MODES; do
    case $mode in
      none) catalog=(--server-catalog none) ;;
      sqlite) catalog=() ;;
      postgres)
        as_pg $pgbin/psql -q -h "$W/pg" -U postgres -d postgres \
          -c 'drop database if exists bench' -c 'create database bench' >/dev/null
        catalog=(--server-catalog "host=$W/pg user=postgres dbname=bench") ;;
    esac
    out=$W/out-$r-$mode
    rm -rf "$out"
    "$BENCH" --rtt "$RTT" --rate 1gbit --regime default --direction put --sizes none \
      --trees 10000x10K --streams 0 --block-sizes default --peers none --runs 1 --no-iperf3 \
      --work "$W/work" --out "$out" --ferry "$FERRY" "${catalog[@]}" >"$out.log" 2>&1
    wall=$(awk -F, 'NR==1{for(i=1;i<=NF;i++) if($i=="wall_s") c=i} NR==2{print $c}' "$out/results.csv")
    echo "$mode round $r: $wall s"
  done
done | tee "$W/walls.txt"
for mode in $MODES; do
  grep "^$mode " "$W/walls.txt" | awk '{print $4}' | sort -g |
    awk -v m=$mode '{a[NR]=$1} END{print m, "median", a[int((NR+1)/2)], "s of", NR}'
done
