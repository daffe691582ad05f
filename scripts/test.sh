#!/usr/bin/env bash
# The whole test suite, as CI runs it. Installs what the tests need (Debian packages for the
# emulated WAN bed and iperf3) when missing, then checks formatting and runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/deps.sh

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
