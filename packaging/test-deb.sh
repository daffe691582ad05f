#!/usr/bin/env bash
# The Debian package end to end, without touching the host: builds it (debug: the test needs no
# release build), installs it with dpkg into a throwaway root (maintainer scripts run on the
# host with DPKG_ROOT set, and create the `ferry` user in the root's /etc/passwd), checks the
# files and what they say, runs the installed binary on the shipped config, reinstalls (the
# user exists by then) and purges. Run by scripts/test.sh; needs dpkg and root (for chown).
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "test-deb: FAIL: $*" >&2; exit 1; }
has() { grep -qx -- "$2" "$1" || fail "$1 has no line \`$2\`"; }
if [ "$(id -u)" -ne 0 ]; then
    echo "test-deb: skipped: needs root (the postinst chowns /srv/ferry in the test root)" >&2
    exit 0
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/ferry-deb-test.XXXXXX")"
server=""
cleanup() {
    [ -z "$server" ] || kill "$server" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
host_users="$(grep -c '^ferry:' /etc/passwd || true)"

deb="$(bash scripts/deb.sh debug "$work/out")"
[ "$(dpkg-deb -f "$deb" Package)" = ferry ] || fail "control: Package is not ferry"
dpkg-deb -f "$deb" Depends | grep -q 'libc6 (>= ' || fail "control: no libc6 dependency"
[ "$(dpkg-deb -I "$deb" conffiles)" = /etc/ferry/serve.toml ] || fail "conffiles"

# A root with what dpkg and useradd --prefix need, and nothing else.
root="$work/root"
mkdir -p "$root/etc" "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates"
touch "$root/var/lib/dpkg/status" "$root/var/lib/dpkg/available"
echo 'root:x:0:0:root:/root:/bin/sh' >"$root/etc/passwd"
echo 'root:x:0:' >"$root/etc/group"
echo 'root:*:19000:0:99999:7:::' >"$root/etc/shadow"
echo 'root:*::' >"$root/etc/gshadow"
install_deb() {
    dpkg --root="$root" --force-not-root --force-script-chrootless --force-depends \
        --log=/dev/null -i "$deb" >"$work/dpkg.log" 2>&1 || { cat "$work/dpkg.log" >&2; fail "dpkg -i"; }
}
install_deb

"$root/usr/bin/ferry" --version | grep -q '^ferry ' || fail "the installed ferry does not run"
unit="$root/lib/systemd/system/ferry.service"
has "$unit" 'User=ferry'
has "$unit" 'ExecStart=/usr/bin/ferry serve --config /etc/ferry/serve.toml'
has "$unit" 'StateDirectory=ferry'
has "$unit" 'Environment=FERRY_STATE_DIR=/var/lib/ferry'
for hardening in NoNewPrivileges=yes ProtectSystem=strict ProtectHome=yes PrivateTmp=yes; do
    has "$unit" "$hardening"
done
has "$root/etc/ferry/serve.toml" 'root = "/srv/ferry"'
dpkg --root="$root" -s ferry | grep -q '^ /etc/ferry/serve.toml ' || fail "serve.toml is not a conffile"
grep -q '^ferry:x:' "$root/etc/passwd" || fail "postinst made no ferry user"
grep -q '^ferry:x:' "$root/etc/group" || fail "postinst made no ferry group"
uid="$(awk -F: '$1 == "ferry" { print $3 }' "$root/etc/passwd")"
for dir in srv/ferry var/lib/ferry; do
    [ "$(stat -c %u "$root/$dir")" = "$uid" ] || fail "/$dir is not the ferry user's"
done
[ "$(stat -c %a "$root/var/lib/ferry")" = 700 ] || fail "/var/lib/ferry is not private"
bash -n "$root/usr/share/bash-completion/completions/ferry" || fail "bash completion"
grep -q '^#compdef ferry' "$root/usr/share/zsh/vendor-completions/_ferry" || fail "zsh completion"
grep -q '^complete -c ferry' "$root/usr/share/fish/vendor_completions.d/ferry.fish" || fail "fish completion"
zcat "$root/usr/share/man/man1/ferry.1.gz" | grep -q '^\.TH ferry' || fail "man ferry"
zcat "$root/usr/share/man/man1/ferry-serve.1.gz" | grep -q -- 'config' || fail "man ferry-serve"

# The installed binary takes the shipped config with every documented key uncommented (a key
# it does not know would stop it), the command line moving the root and ports into the test's
# directory.
mkdir -p "$work/srv"
sed 's/^# \([a-z_]* = \)/\1/' "$root/etc/ferry/serve.toml" >"$work/serve.toml"
[ "$(grep -c '^[a-z_]* = ' "$work/serve.toml")" -eq 23 ] || fail "serve.toml documents other than its 23 keys (all but token_file)"
FERRY_STATE_DIR="$work/state" "$root/usr/bin/ferry" serve --config "$work/serve.toml" \
    --root "$work/srv" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
    --token-file "$work/token" 2>"$work/serve.log" &
server=$!
for _ in $(seq 100); do
    grep -q '^ferry: serving ' "$work/serve.log" && break
    kill -0 "$server" 2>/dev/null || break
    sleep 0.1
done
grep -q "^ferry: serving $work/srv on 127.0.0.1:" "$work/serve.log" ||
    { cat "$work/serve.log" >&2; fail "ferry serve --config /etc/ferry/serve.toml did not serve"; }
kill "$server"
wait "$server" 2>/dev/null || true
server=""

# Again, the user existing now; then purged.
install_deb
[ "$(grep -c '^ferry:' "$root/etc/passwd")" = 1 ] || fail "reinstall: ferry user twice"
dpkg --root="$root" --force-not-root --force-script-chrootless --log=/dev/null -P ferry \
    >"$work/dpkg.log" 2>&1 || { cat "$work/dpkg.log" >&2; fail "dpkg -P"; }
[ ! -e "$root/usr/bin/ferry" ] && [ ! -e "$root/etc/ferry/serve.toml" ] &&
    [ ! -e "$root/var/lib/ferry" ] || fail "purge left files"
[ "$(grep -c '^ferry:' /etc/passwd || true)" = "$host_users" ] || fail "the host's /etc/passwd changed"
echo "test-deb: ok: $(basename "$deb") installs into a throwaway root, runs, reinstalls and purges" >&2
