# Sourced by the issue-39 catalog benches: the tiny tree they put, and a throwaway PostgreSQL
# cluster (unix socket only, under $W/pg; Debian's postgresql; run as root: it runs as
# `postgres`).

# tiny_tree W: 10,000 random 10 KiB files in 100 directories under W/src/tree.
tiny_tree() {
  W=$1 python3 - <<'PY'
import os
for i in range(10000):
    d=f"{os.environ['W']}/src/tree/d{i%100:02d}"
    os.makedirs(d,exist_ok=True)
    with open(f"{d}/f{i:05d}","wb") as f: f.write(os.urandom(10240))
PY
}

as_pg() { setpriv --reuid=postgres --regid=postgres --clear-groups "$@"; }

# pg_start W [SETTING...]: a fresh cluster in W/pg listening on its socket directory W/pg,
# each SETTING a `-c name=value` for the server; stopped when the script exits. Sets pgbin.
pg_start() {
  local w=$1; shift
  pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
  rm -rf "$w/pg"; mkdir -p "$w/pg"; chown postgres: "$w/pg"; chmod 755 "$w"
  as_pg "$pgbin/initdb" -D "$w/pg/data" -U postgres -A trust -E UTF8 --locale=C >/dev/null
  as_pg "$pgbin/pg_ctl" -D "$w/pg/data" -l "$w/pg/log" -w \
    -o "-c listen_addresses='' -c unix_socket_directories=$w/pg $*" start >/dev/null
  trap "as_pg $pgbin/pg_ctl -D $w/pg/data -m fast stop >/dev/null" EXIT
}
