#!/usr/bin/env bash
# Installs what `ferry-bench` uses, only what is missing (idempotent; needs root or sudo only
# when something is missing):
#   ip, iperf3, ping                       via scripts/netem-deps.sh (the emulated WAN bed)
#   DejaVu Sans (fonts-dejavu-core)        text in the PNG plots (loaded at run time)
#   b3sum                                  the tests that check ferry's BLAKE3 against it
#   rsync                                  peer: rsync daemon in the server namespace
#   sshd + ssh/scp (openssh-server/-client) tests of ssh-started sessions; peer: scp
#   xrootd + xrdcp (xrootd-server/-client) peer: XRootD
#   globus-url-copy + globus-gridftp-server peer: GridFTP
#     (globus-gass-copy-progs, globus-gridftp-server-progs)
# A peer package that the configured apt sources do not have is reported and skipped; the bench
# then says in its summary that the peer is not installed.
#
#   bash scripts/bench-deps.sh            # everything above
#   bash scripts/bench-deps.sh --no-peers # only the bed, iperf3 and the font
set -euo pipefail
cd "$(dirname "$0")/.."

peers=1
[ "${1:-}" = "--no-peers" ] && peers=0

if [ -f scripts/netem-deps.sh ]; then
    bash scripts/netem-deps.sh
fi

# command-or-file -> package
declare -a want=(
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf=fonts-dejavu-core"
    "b3sum=b3sum"
    # The tests of ssh-started sessions (`ferry put FILES user@host:PATH`) run a local sshd.
    "ssh=openssh-client"
    "ssh-keygen=openssh-client"
    "/usr/sbin/sshd=openssh-server"
)
if [ "$peers" = 1 ]; then
    want+=(
        "rsync=rsync"
        "scp=openssh-client"
        "xrootd=xrootd-server"
        "xrdcp=xrootd-client"
        "globus-url-copy=globus-gass-copy-progs"
        "globus-gridftp-server=globus-gridftp-server-progs"
    )
fi

missing=()
for w in "${want[@]}"; do
    what="${w%%=*}"
    pkg="${w#*=}"
    if [[ "$what" == /* ]]; then
        [ -e "$what" ] && continue
    else
        command -v "$what" >/dev/null 2>&1 && continue
        # sbin is not always on PATH
        [ -x "/usr/sbin/$what" ] && continue
    fi
    case " ${missing[*]:-} " in *" $pkg "*) ;; *) missing+=("$pkg") ;; esac
done

if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo"
    else
        echo "bench-deps: need root (or sudo) to install: ${missing[*]}" >&2
        exit 1
    fi
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
installable=()
for pkg in "${missing[@]}"; do
    cand="$(apt-cache policy "$pkg" 2>/dev/null | awk '/Candidate:/ {print $2}')"
    if [ -z "$cand" ] || [ "$cand" = "(none)" ]; then
        echo "bench-deps: $pkg is not available from the apt sources here; skipping it" >&2
    else
        installable+=("$pkg")
    fi
done
if [ ${#installable[@]} -gt 0 ]; then
    echo "bench-deps: installing ${installable[*]}" >&2
    # policy-rc.d: do not start the distribution's sshd/xrootd/gridftp services; the bench runs
    # its own instances inside the emulated server namespace.
    prc=/usr/sbin/policy-rc.d
    created_prc=0
    if [ ! -e "$prc" ]; then
        printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$prc" >/dev/null
        $SUDO chmod 755 "$prc"
        created_prc=1
    fi
    rc=0
    $SUDO apt-get install -y -qq --no-install-recommends "${installable[@]}" >/dev/null || rc=$?
    [ "$created_prc" = 1 ] && $SUDO rm -f "$prc"
    exit $rc
fi
