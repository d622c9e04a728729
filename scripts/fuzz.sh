#!/usr/bin/env bash
# Long fuzzing mode: runs every cargo-fuzz target in fuzz/ for
# SECONDS_PER_TARGET seconds (default 600), one after the other, then prints
# one line per target: seconds, libFuzzer's executed units, corpus files and
# crash files (in fuzz/artifacts/TARGET). Exits non-zero if any target left a
# crash, timeout or OOM artifact.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET]
#
# Needs a nightly toolchain (`cargo +nightly fuzz`); without one it falls
# back to `RUSTC_BOOTSTRAP=1 cargo fuzz` on stable. Installs cargo-fuzz if it
# is missing. New corpus entries land in fuzz/corpus/TARGET; shrink them
# with `cargo +nightly fuzz cmin TARGET` before committing. CI never runs
# this: tests/fuzz_corpus.rs replays the committed corpora on stable.
#
# Environment: FUZZ_TARGETS="wire manifest" runs only those targets;
# FUZZ_ARGS adds libFuzzer flags (e.g. "-max_len=65536").
set -euo pipefail

secs=${1:-600}
case $secs in
'' | *[!0-9]*)
    echo "usage: $0 [SECONDS_PER_TARGET]" >&2
    exit 2
    ;;
esac

here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here/fuzz"

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "installing cargo-fuzz..." >&2
    cargo install --locked cargo-fuzz
fi

if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    fuzz=(cargo +nightly fuzz)
else
    echo "no nightly toolchain: using RUSTC_BOOTSTRAP=1 on $(rustc --version)" >&2
    export RUSTC_BOOTSTRAP=1
    fuzz=(cargo fuzz)
fi

targets=${FUZZ_TARGETS:-$("${fuzz[@]}" list)}
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

"${fuzz[@]}" build >&2

count() { # files directly in $1 (0 if it does not exist)
    if [ -d "$1" ]; then find "$1" -maxdepth 1 -type f | wc -l; else echo 0; fi
}

rows=()
failed=0
for t in $targets; do
    mkdir -p "corpus/$t"
    before=$(count "artifacts/$t")
    echo "== $t: ${secs}s" >&2
    start=$(date +%s)
    # A crash ends the run early with a non-zero status; the table says so.
    # shellcheck disable=SC2086 # FUZZ_ARGS is a list of flags
    "${fuzz[@]}" run "$t" "corpus/$t" -- \
        -max_total_time="$secs" -timeout=30 -print_final_stats=1 ${FUZZ_ARGS:-} \
        >"$logs/$t.log" 2>&1 || true
    took=$(($(date +%s) - start))
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$logs/$t.log" | tail -n1)
    crashes=$(count "artifacts/$t")
    if [ "$crashes" -gt "$before" ] || grep -q '^==[0-9]*== ERROR: libFuzzer\|^SUMMARY: libFuzzer' "$logs/$t.log"; then
        echo "-- $t: libFuzzer reported a failure; the end of its log:" >&2
        tail -n 40 "$logs/$t.log" >&2
    fi
    [ "$crashes" -eq 0 ] || failed=1
    rows+=("$(printf '%-10s %6s %12s %8s %8s' "$t" "$took" "${execs:-?}" "$(count "corpus/$t")" "$crashes")")
done

printf '%-10s %6s %12s %8s %8s\n' target secs execs corpus crashes
printf '%s\n' "${rows[@]}"
if [ "$failed" -ne 0 ]; then
    echo "crashes found: see fuzz/artifacts/; reproduce with \`cargo +nightly fuzz run TARGET FILE\`" >&2
    exit 1
fi
