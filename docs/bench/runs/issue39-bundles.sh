#!/bin/bash
# Bundles against plain transfers of the same tree (issue 39), on loopback to `ferry serve`
# with its catalog (SQLite in the state directory): `put --untar` of a GNU tar of the tree
# against `put` of the tree, and `get --tar -o` of it against `get` of the tree, ROUNDS rounds
# alternating. The tree: FILES files of SIZE bytes (random). Prints each run's seconds and MB/s.
# W is where everything lives (an ext4 of its own keeps others' writes out of the syncs).
set -e
FERRY=${FERRY:-target/release/ferry}
ROUNDS=${ROUNDS:-3}
FILES=${FILES:-2000}
SIZE=${SIZE:-262144}
W=${W:-/tmp/ferry-bundle-bench}
FERRY=$(realpath "$FERRY")
rm -rf "$W"; mkdir -p "$W/src" "$W/home" "$W/root" "$W/state"
W=$W FILES=$FILES SIZE=$SIZE python3 - <<'PY'
import os
w, n, size = os.environ['W'], int(os.environ['FILES']), int(os.environ['SIZE'])
for i in range(n):
    d = f"{w}/src/tree/d{i % 50:02d}"
    os.makedirs(d, exist_ok=True)
    with open(f"{d}/f{i:05d}", "wb") as f:
        f.write(os.urandom(size))
PY
(cd "$W/src" && tar -cf "$W/tree.tar" tree)
bytes=$((FILES * SIZE))
export HOME=$W/home XDG_CONFIG_HOME=$W/home/.config FERRY_NO_PROGRESS=1 FERRY_STATE_DIR=$W/state
port=$((20000 + RANDOM % 20000))
"$FERRY" serve --root "$W/root" --listen 127.0.0.1:$port --token-file "$W/state/token" 2>"$W/serve.log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null' EXIT
for i in $(seq 600); do grep -q serving "$W/serve.log" 2>/dev/null && [ -s "$W/state/token" ] && break; sleep 0.1; done
export FERRY_TOKEN=$(cat "$W/state/token")
# Seed what the gets read: one put of the tree (unrecorded).
"$FERRY" put --quiet "$W/src/tree" 127.0.0.1:$port:/seed/ >/dev/null
run() { # name, command...
  local name=$1; shift
  sync
  local t0=$(date +%s.%N)
  "$@" >/dev/null
  local t1=$(date +%s.%N)
  local s=$(echo "$t1 - $t0" | bc)
  echo "$name $s s $(echo "scale=1; $bytes / $s / 1000000" | bc) MB/s"
}
echo "tree: $FILES files x $SIZE bytes = $bytes bytes; archive $(stat -c %s "$W/tree.tar") bytes; $FERRY"
for r in $(seq "$ROUNDS"); do
  run put-tree "$FERRY" put --quiet "$W/src/tree" 127.0.0.1:$port:/p$r/
  run put-untar "$FERRY" put --quiet --untar "$W/tree.tar" 127.0.0.1:$port:/u$r/
  rm -rf "$W/got"; mkdir -p "$W/got"
  run get-tree "$FERRY" get --quiet 127.0.0.1:$port:/seed/tree "$W/got/"
  run get-tar "$FERRY" get --quiet --tar 127.0.0.1:$port:/seed/tree -o "$W/got.tar"
  "$FERRY" rm --quiet -r 127.0.0.1:$port:/p$r
  "$FERRY" rm --quiet -r 127.0.0.1:$port:/u$r
done
# What came back is what went: GNU tar reads the archive, the files equal the source's.
rm -rf "$W/check"; mkdir -p "$W/check"; tar -xf "$W/got.tar" -C "$W/check"
top=$W/check; [ -d "$W/check/tree" ] && top=$W/check/tree
diff -r "$W/src/tree" "$top" && diff -r "$W/src/tree" "$W/got/tree" && echo "verified: the tar and the get equal the source"
