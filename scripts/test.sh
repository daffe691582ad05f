#!/usr/bin/env bash
# The whole test suite, as CI runs it. Installs what the tests need (Debian packages for the
# emulated WAN bed and iperf3) when missing, then checks formatting and runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/deps.sh

# The tests write up to about 1.6 GiB of temporary files at once (measured on a full run) and the
# build needs about 5 GiB. A nearly full disk made a whole run fail with ENOSPC in a dozen
# unrelated tests, so check first: if TMPDIR's file system is short and /dev/shm has room, run
# the tests' temporary files there (nothing in them depends on the file system type; the suite
# passes on tmpfs), else say plainly what is missing.
free_mib() { df -Pm "$1" 2>/dev/null | awk 'NR == 2 { print $4 }' || true; }
tmp="${TMPDIR:-/tmp}"
need_tmp=3072
tmp_free="$(free_mib "$tmp")"
if [ -n "$tmp_free" ] && [ "$tmp_free" -lt "$need_tmp" ]; then
    shm_free="$(free_mib /dev/shm)"
    if [ -n "$shm_free" ] && [ "$shm_free" -ge $((need_tmp + 1024)) ]; then
        TMPDIR="$(mktemp -d /dev/shm/ferry-test.XXXXXX)"
        export TMPDIR
        trap 'rm -rf "$TMPDIR"' EXIT
        echo "test.sh: $tmp has ${tmp_free} MiB free, the tests need about ${need_tmp}; using $TMPDIR (${shm_free} MiB free)" >&2
    else
        echo "test.sh: warning: $tmp has ${tmp_free} MiB free and the tests need about ${need_tmp} MiB; expect failures from a full disk (ENOSPC)" >&2
    fi
fi
build_free="$(free_mib .)"
if [ -n "$build_free" ] && [ "$build_free" -lt 2048 ]; then
    echo "test.sh: warning: the build directory's file system has ${build_free} MiB free; a build from scratch needs about 5 GiB" >&2
fi

cargo fmt --all -- --check
# The WAN-emulator tests measure rates and delays, so they run alone, after everything else,
# not next to CPU-heavy transfer tests on a 2-core machine.
if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --workspace --no-fail-fast -E 'not package(ferry-netem)'
    cargo nextest run -p ferry-netem --no-fail-fast --test-threads 1
else
    cargo test --workspace --no-fail-fast --exclude ferry-netem
    cargo test -p ferry-netem --no-fail-fast -- --test-threads 1
fi
