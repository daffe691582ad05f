#!/bin/bash
# Usage: ab.sh LABEL... where LABEL is s (shared, this branch), p (pinned, this branch),
# m (pinned, main's ferry 1e57270 release). One bench run each, in order.
cd /work/wt/svcpin
B=target/release/ferry-bench
n=0
for l in "$@"; do
  n=$((n+1))
  case $l in
    s) F=target/release/ferry; P="";;
    p) F=target/release/ferry; P="--service-cpus 0 --bed-cpus 1";;
    m) F=/work/svcpin-ab/ferry-main; P="--service-cpus 0 --bed-cpus 1";;
    ms) F=/work/svcpin-ab/ferry-main; P="";;
  esac
  out=/work/svcpin-ab/runs/$n-$l
  echo "=== run $n $l $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  $B --mode service --ferry $F --jobs 1000 --dark-secs 0 --work /work/svcpin-ab/work --out $out $P > $out.stdout 2> $out.stderr
  echo "rc $? end $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  grep -E "^\| |Placement|lock over|jobs done and verified" $out/summary.md | head -20
done
