#!/usr/bin/env bash
# The whole test suite, as CI runs it. Installs what the tests need (Debian packages for the
# emulated WAN bed, iperf3 and sshd) when missing, then checks formatting and lints, runs every
# test, and says how many tests needed privileges and whether the run left anything behind.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step's wall time, printed at the end: CI has a budget (25 minutes) and the steps' share
# of it says where to cut when the suite grows.
steps=()
step() {
    local name="$1" start=$SECONDS r=0
    shift
    "$@" || r=$?
    steps+=("$name $((SECONDS - start)) s")
    return "$r"
}

step deps bash scripts/deps.sh

# The tests write up to about 1.6 GiB of temporary files at once (measured on a full run) and the
# build needs about 5 GiB. A nearly full disk made a whole run fail with ENOSPC in a dozen
# unrelated tests, so check first: if TMPDIR's file system is short and /dev/shm has room, run
# the tests' temporary files there (nothing in them depends on the file system type; the suite
# passes on tmpfs), else say plainly what is missing.
free_mib() { df -Pm "$1" 2>/dev/null | awk 'NR == 2 { print $4 }' || true; }
base="${TMPDIR:-/tmp}"
need_tmp=3072
tmp_free="$(free_mib "$base")"
if [ -n "$tmp_free" ] && [ "$tmp_free" -lt "$need_tmp" ]; then
    shm_free="$(free_mib /dev/shm)"
    if [ -n "$shm_free" ] && [ "$shm_free" -ge $((need_tmp + 1024)) ]; then
        echo "test.sh: $base has ${tmp_free} MiB free, the tests need about ${need_tmp}; using /dev/shm (${shm_free} MiB free)" >&2
        base=/dev/shm
    else
        echo "test.sh: warning: $base has ${tmp_free} MiB free and the tests need about ${need_tmp} MiB; expect failures from a full disk (ENOSPC)" >&2
    fi
fi
build_free="$(free_mib .)"
if [ -n "$build_free" ] && [ "$build_free" -lt 2048 ]; then
    echo "test.sh: warning: the build directory's file system has ${build_free} MiB free; a build from scratch needs about 5 GiB" >&2
fi

# The tests get a temporary directory of their own, checked afterwards: a test run leaves
# nothing behind. Beside it, each test that needs root or something of the host (namespaces,
# TUN, a tmpfs mount, sshd, a tool) leaves a marker saying whether it could run
# (ferry_netem::needs; with CI set, one that could not fails).
work="$(mktemp -d "$base/ferry-test.XXXXXX")"
trap 'rm -rf "$work"' EXIT
mkdir "$work/tmp" "$work/needs"
# The catalog's tests run PostgreSQL as the `postgres` user (it refuses root) in a directory of
# TMPDIR: that user may pass through (not list) the directories on the way.
chmod 711 "$work" "$work/tmp"
export TMPDIR="$work/tmp" FERRY_TEST_NEEDS_DIR="$work/needs"

cargo fmt --all -- --check
# Under the test profile, as nextest builds: otherwise the C libraries' build scripts (aws-lc,
# SQLite) ran twice per CI, once for each profile.
step clippy cargo clippy --workspace --all-targets --profile test -- -D warnings
# The WAN-emulator tests measure rates and delays, so they run alone, after everything else,
# not next to CPU-heavy transfer tests on a 2-core machine.
rc=0
if cargo nextest --version >/dev/null 2>&1; then
    step tests cargo nextest run --workspace --no-fail-fast -E 'not package(ferry-netem)' || rc=$?
    step netem cargo nextest run -p ferry-netem --no-fail-fast --test-threads 1 || rc=$?
else
    step tests cargo test --workspace --no-fail-fast --exclude ferry-netem || rc=$?
    step netem cargo test -p ferry-netem --no-fail-fast -- --test-threads 1 || rc=$?
fi
# The Debian package, built from the debug binary the tests used, installed into a throwaway
# root (a few seconds).
tested_bin="${CARGO_TARGET_DIR:-target}/debug/ferry"
if [ -x "$tested_bin" ]; then
    FERRY_BIN="$(realpath "$tested_bin")" step deb bash packaging/test-deb.sh || rc=$?
else
    step deb bash packaging/test-deb.sh || rc=$?
fi
echo "test.sh: wall time per step: ${steps[*]/%/,} in all ${SECONDS} s" >&2

# How many tests needed privileges or host facilities, and how many of them could not run.
ran="$(ls "$work/needs/ran" 2>/dev/null || true)"
unmet="$(ls "$work/needs/unmet" 2>/dev/null || true)"
total="$(printf '%s\n%s\n' "$ran" "$unmet" | sed '/^$/d' | sort -u | wc -l)"
n_unmet="$(printf '%s\n' "$unmet" | sed '/^$/d' | wc -l)"
echo "test.sh: $total tests needed root or a host facility (namespaces, TUN, tmpfs mounts, sshd, tools): $((total - n_unmet)) ran in full, $n_unmet could not${CI:+ (with CI set, each of those failed)}" >&2
if [ "$n_unmet" -gt 0 ]; then
    echo "test.sh: could not run in full: $(printf '%s\n' "$unmet" | tr '\n' ' ')" >&2
fi

left="$(find "$TMPDIR" -mindepth 1 -maxdepth 1 2>/dev/null | head -20)"
if [ -n "$left" ]; then
    echo "test.sh: the tests left files in their temporary directory:" >&2
    printf '%s\n' "$left" | sed 's/^/  /' >&2
    [ "$rc" -ne 0 ] || rc=1
fi
exit "$rc"
