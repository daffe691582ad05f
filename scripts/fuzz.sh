#!/usr/bin/env bash
# Runs every cargo-fuzz target for a fixed time and reports, per target, how many inputs ran
# and whether it crashed. Nothing is minimised or committed: new corpus entries stay in
# fuzz/corpus/<target>/ for you to review (`cargo +nightly fuzz cmin <target>` before
# committing keeps the corpus small); crashes land in fuzz/artifacts/<target>/.
#
#   scripts/fuzz.sh            # 60 s per target
#   scripts/fuzz.sh 600        # 10 min per target
#
# Needs nightly and cargo-fuzz (`cargo install cargo-fuzz`). The short, bounded pass that CI
# runs on stable is `cargo test -p ferry-proto --test corpus --test handshake`.
set -uo pipefail
cd "$(dirname "$0")/.."

secs="${1:-60}"
case "$secs" in
    '' | *[!0-9]*) echo "usage: $0 [seconds per target]" >&2; exit 2 ;;
esac
targets=(frame_decode journal_decode handshake)
# Fuzz builds are nightly builds with sanitizer flags: keep them out of the workspace's target.
export CARGO_TARGET_DIR="${FUZZ_TARGET_DIR:-$PWD/fuzz/target}"
logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT

failed=0
summary=()
for t in "${targets[@]}"; do
    echo "== $t: ${secs}s" >&2
    log="$logs/$t.log"
    (cd fuzz && cargo +nightly fuzz run "$t" -- -max_total_time="$secs") >"$log" 2>&1
    rc=$?
    runs="$(grep -Eo 'Done [0-9]+ runs' "$log" | tail -1 | grep -Eo '[0-9]+')"
    corpus="$(find "fuzz/corpus/$t" -type f | wc -l)"
    if [ "$rc" -eq 0 ]; then
        summary+=("$t: ok, ${runs:-?} runs in ${secs}s, corpus $corpus inputs")
    else
        failed=1
        crash="$(grep -Eo 'Test unit written to [^ ]+' "$log" | tail -1 | cut -d' ' -f5)"
        summary+=("$t: FAILED (exit $rc) ${crash:+crash input: $crash}")
        tail -40 "$log" >&2
    fi
done
printf '%s\n' "${summary[@]}"
exit "$failed"
