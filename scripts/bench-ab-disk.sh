#!/usr/bin/env bash
# Before/after of two ferry builds on the real file system (issue 36): first transfer and
# repeat. Per binary and round, one loopback server with fresh state, a 1 GiB put into an empty
# destination (first), then the same put again (repeat: everything there, nothing sent).
# Alternates the binaries round by round; prints CSV rows (round,label,case,seconds).
#   bash scripts/bench-ab-disk.sh BEFORE_BIN AFTER_BIN [ROUNDS]    # W: work dir on the disk
# Needs bc; the work directory must be on the file system to measure (default /var/tmp).
set -euo pipefail
B=$1; A=$2; ROUNDS=${3:-3}; W=${W:-/var/tmp/ferry-disk-ab}; rm -rf $W; mkdir -p $W
head -c 1G /dev/urandom > $W/src.bin; sync
echo "round,label,case,seconds"
for r in $(seq 1 $ROUNDS); do
  if [ $((r % 2)) = 1 ]; then order="before:$B after:$A"; else order="after:$A before:$B"; fi
  for pair in $order; do
    label=${pair%%:*}; bin=${pair#*:}; lb=$W/$label-$r; mkdir -p $lb/root $lb/state $lb/cstate $lb/cfg
    if [ $label = after ]; then port=$((21001 + r * 2)); else port=$((21000 + r * 2)); fi
    FERRY_STATE_DIR=$lb/state $bin serve --root $lb/root --listen 127.0.0.1:$port \
      --token-file $lb/token > $lb/serve.log 2>&1 & pid=$!
    for i in $(seq 1 100); do grep -q serving $lb/serve.log 2>/dev/null && break; sleep 0.1; done
    fp=$(grep -o 'sha256:[0-9a-f]*' $lb/serve.log | head -1)
    for case in first repeat; do
      t0=$(date +%s.%N)
      FERRY_STATE_DIR=$lb/cstate XDG_CONFIG_HOME=$lb/cfg FERRY_KNOWN_HOSTS=$lb/cfg/known_hosts FERRY_TOKEN=$(cat $lb/token) timeout 120 $bin -q put $W/src.bin 127.0.0.1:$port:/d/ \
        --server-fingerprint $fp > /dev/null
      t1=$(date +%s.%N)
      echo "$r,$label,$case,$(echo "$t1 - $t0" | bc)"
    done
    cmp $W/src.bin $lb/root/d/src.bin
    kill $pid; wait $pid 2>/dev/null || true; rm -rf $lb/root
  done
done
rm -rf $W
