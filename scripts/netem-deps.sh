#!/usr/bin/env bash
# Install the packages the ferry-netem WAN emulator and its tests need:
#   ip      (iproute2)     - namespaces, links, addresses, routes
#   iperf3  (iperf3)       - throughput tests
#   ping    (iputils-ping) - RTT tests
# Idempotent: does nothing when every command is already present.
set -euo pipefail

declare -A want=([ip]=iproute2 [iperf3]=iperf3 [ping]=iputils-ping)
missing=()
for cmd in "${!want[@]}"; do
    command -v "$cmd" >/dev/null 2>&1 || missing+=("${want[$cmd]}")
done

if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo"
    else
        echo "netem-deps: need root (or sudo) to install: ${missing[*]}" >&2
        exit 1
    fi
fi

echo "netem-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
