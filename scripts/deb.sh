#!/usr/bin/env bash
# Builds ferry and packs it as a Debian package, with nothing but cargo and dpkg-deb (no
# cargo-deb, no debhelper): scripts/deb.sh [release|debug] [OUTDIR]. Prints the .deb's path.
#
# The package: /usr/bin/ferry (debug info stripped), the systemd unit ferry.service (runs
# `ferry serve --config /etc/ferry/serve.toml` as the system user `ferry`, state in
# /var/lib/ferry, serving /srv/ferry), the config (a conffile), man pages and bash, zsh and
# fish completions generated from the CLI definition (`ferry generate`), and maintainer
# scripts (packaging/debian) that create the user. The test builds a debug one
# (packaging/test-deb.sh); release is what to ship.
set -euo pipefail
cd "$(dirname "$0")/.."

profile="${1:-release}"
out="${2:-target/deb}"
case "$profile" in
    release) dir=release compress=(-Zxz) ;;
    # A test's package: fast gzip over xz's smaller size (xz takes ~20 s on a busy 2-core host).
    debug | dev) profile=dev dir=debug compress=(-Zgzip -z1) ;;
    *) echo "usage: scripts/deb.sh [release|debug] [OUTDIR]" >&2; exit 2 ;;
esac
command -v dpkg-deb >/dev/null || { echo "deb.sh: dpkg-deb is needed (Debian's dpkg)" >&2; exit 2; }

# FERRY_BIN: a binary already built (the test suite's), instead of building one: a build of
# ferry-cli alone unifies features differently from the workspace's and rebuilds 19 crates.
if [ -n "${FERRY_BIN:-}" ]; then
    bin="$FERRY_BIN"
else
    cargo build --locked --profile "$profile" -p ferry-cli --bin ferry >&2
    bin="${CARGO_TARGET_DIR:-target}/$dir/ferry"
fi
version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
arch="$(dpkg --print-architecture)"

stage="$(mktemp -d "${TMPDIR:-/tmp}/ferry-deb.XXXXXX")"
trap 'rm -rf "$stage"' EXIT
pkg="$stage/ferry_${version}_${arch}"
install -d "$pkg/DEBIAN" "$pkg/usr/bin" "$pkg/lib/systemd/system" "$pkg/etc/ferry" \
    "$pkg/usr/share/man/man1" "$pkg/usr/share/doc/ferry" \
    "$pkg/usr/share/bash-completion/completions" "$pkg/usr/share/zsh/vendor-completions" \
    "$pkg/usr/share/fish/vendor_completions.d"
install -m 0755 "$bin" "$pkg/usr/bin/ferry"
strip --strip-debug "$pkg/usr/bin/ferry"
install -m 0644 packaging/ferry.service "$pkg/lib/systemd/system/ferry.service"
install -m 0644 packaging/serve.toml "$pkg/etc/ferry/serve.toml"
install -m 0644 README.md "$pkg/usr/share/doc/ferry/README.md"

gen="$stage/gen"
"$bin" generate completions "$gen/completions"
"$bin" generate man "$gen/man"
install -m 0644 "$gen/completions/ferry.bash" "$pkg/usr/share/bash-completion/completions/ferry"
install -m 0644 "$gen/completions/_ferry" "$pkg/usr/share/zsh/vendor-completions/_ferry"
install -m 0644 "$gen/completions/ferry.fish" "$pkg/usr/share/fish/vendor_completions.d/ferry.fish"
for page in "$gen"/man/*.1; do
    gzip -9n <"$page" >"$pkg/usr/share/man/man1/$(basename "$page").gz"
    chmod 0644 "$pkg/usr/share/man/man1/$(basename "$page").gz"
done

for script in postinst prerm postrm; do
    install -m 0755 "packaging/debian/$script" "$pkg/DEBIAN/$script"
done
echo /etc/ferry/serve.toml >"$pkg/DEBIAN/conffiles"
# The newest glibc symbol version the binary uses is the libc6 it needs.
glibc="$(objdump -T "$pkg/usr/bin/ferry" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -1)"
cat >"$pkg/DEBIAN/control" <<CONTROL
Package: ferry
Version: $version
Architecture: $arch
Maintainer: ferry developers <ferry@localhost>
Installed-Size: $(du -sk --exclude=DEBIAN "$pkg" | cut -f1)
Depends: libc6 (>= ${glibc:-2.17}), passwd
Section: net
Priority: optional
Description: move files and trees between hosts as fast as the path allows
 ferry moves bulk data over parallel TCP connections with TLS, verifies it end to
 end and resumes interrupted transfers. This package holds the client and the
 server, with a systemd unit (ferry.service) that runs the server as its own user.
CONTROL

mkdir -p "$out"
deb="$out/ferry_${version}_${arch}.deb"
dpkg-deb --root-owner-group "${compress[@]}" --build "$pkg" "$deb" >&2
echo "$deb"
