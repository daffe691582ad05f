#!/usr/bin/env bash
# Installs the system packages ferry's tests and benchmarks use, only when missing.
# Idempotent; needs root (apt-get) only when something is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -f scripts/netem-deps.sh ]; then
    bash scripts/netem-deps.sh
fi
