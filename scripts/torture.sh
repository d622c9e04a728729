#!/usr/bin/env bash
# The torture suite (issue 8) with one summary table of figures.
#
#   scripts/torture.sh [short|long] [FUZZ_SECS]
#
# short (the default; what `scripts/test.sh` runs as part of the normal
# test command): the network cases (crash loop of 6 kills, 0/1/5 % packet
# loss, partitions of 3 s) and the node cases (disk full, bit rot, an
# authentication storm of 60 attempts per kind) on small models, and the
# fuzz corpora replayed on stable Rust.
# long: 30 kills, larger models, 10 s partitions, 1,000 attempts per kind,
# and every fuzz target for FUZZ_SECS seconds (default 600) with
# scripts/fuzz.sh.
#
# Needs root (network namespaces, nftables, mounts). Prints the table on
# stdout, one row per case: the case and its figures (key=value), then a
# verdict; exits non-zero when any case failed or a fuzz target crashed.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-short}
fuzz_secs=${2:-600}
case $mode in
short | long) ;;
*)
    echo "usage: $0 [short|long] [FUZZ_SECS]" >&2
    exit 2
    ;;
esac

log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
echo "== torture ($mode): cargo test --test suite --test shaped_net -- torture_net:: torture_node:: fuzz_corpus::" >&2
XFER_TORTURE=$mode cargo test -p xfer --test suite --test shaped_net \
    -- --nocapture --test-threads=1 torture_net:: torture_node:: fuzz_corpus:: 2>&1 | tee "$log" >&2 || status=$?

fuzz_table=""
if [ "$mode" = long ]; then
    echo "== fuzz: scripts/fuzz.sh $fuzz_secs" >&2
    fuzz_out=$(mktemp)
    scripts/fuzz.sh "$fuzz_secs" | tee "$fuzz_out" >&2 || status=1
    fuzz_table=$(cat "$fuzz_out")
    rm -f "$fuzz_out"
fi

echo
echo "torture suite ($mode), $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores"
printf '%-14s %s\n' case figures
grep -o 'TORTURE case=.*' "$log" | sed 's/^TORTURE case=//' |
    awk '{ c = $1; $1 = ""; printf "%-14s%s\n", c, $0 }'
if [ -n "$fuzz_table" ]; then
    echo
    echo "$fuzz_table"
fi
passed=$(awk '/^test result:/ { s += $4 } END { print s + 0 }' "$log")
failed=$(awk '/^test result:/ { s += $6 } END { print s + 0 }' "$log")
echo
echo "tests: $passed passed, $failed failed"
[ "$failed" = 0 ] || status=1
exit "$status"
