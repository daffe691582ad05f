#!/usr/bin/env bash
# Installs the system packages ferry's tests and benchmarks use, only when missing.
# Idempotent; needs root (apt-get) only when something is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -f scripts/bench-deps.sh ]; then
    # The emulated WAN bed, iperf3 and the plot font; peer tools only for real benchmark runs.
    bash scripts/bench-deps.sh --no-peers
elif [ -f scripts/netem-deps.sh ]; then
    bash scripts/netem-deps.sh
fi
# The filter tests compare ferry's --exclude/--include with what rsync itself selects.
if ! command -v rsync >/dev/null 2>&1; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq rsync >/dev/null
fi
# The dashboard's browser test drives Debian's headless Chromium over the DevTools protocol.
if [ ! -x /usr/bin/chromium ]; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-cache show chromium >/dev/null 2>&1; then
        $SUDO apt-get update -qq >/dev/null
    fi
    $SUDO apt-get install -y -qq chromium >/dev/null
fi
# The catalog's tests run a throwaway PostgreSQL cluster (Debian's initdb and postgres, started
# in the tests' temporary directory; nothing is left running).
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-cache show postgresql >/dev/null 2>&1; then
        $SUDO apt-get update -qq >/dev/null
    fi
    $SUDO apt-get install -y -qq postgresql >/dev/null
fi
