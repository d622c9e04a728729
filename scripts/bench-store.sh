#!/usr/bin/env bash
# The node's store over months (issue 57), on loopback with one agent:
#
# 1. `xfer ls` on a root of MODELS models (each a small folder pushed
#    with `xfer push`): its time against the floor of one `xfer status`
#    of the same root (one round trip, the same agent), median of RUNS;
# 2. a push that must evict first against one that has room, the same
#    size in the same run: an agent with a budget of 2.5 x SIZE_MIB
#    (`serve --max-bytes`, `--evict-above 100%`) takes model 1 and model 2
#    with room (model 2 timed), then model 3, which evicts model 1 first
#    (timed); RUNS pairs, medians and the ratio.
#
# Env [default]: MODELS [200], SIZE_MIB [128], RUNS [3], PORT [17640],
# XFER [target/release/xfer; built if missing],
# ST_DIR [/var/tmp/xfer-bench-store].
# Runtime on 2 cores: about 1 minute at the defaults.

set -euo pipefail
shopt -s inherit_errexit
export LC_ALL=C

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPT_DIR/.." && pwd)
LOG_TAG=store
# shellcheck source=scripts/lib-bench.sh
source "$SCRIPT_DIR/lib-bench.sh"

MODELS=${MODELS:-200}
SIZE_MIB=${SIZE_MIB:-128}
RUNS=${RUNS:-3}
PORT=${PORT:-17640}
ST_DIR=${ST_DIR:-/var/tmp/xfer-bench-store}
RUN=$ST_DIR/run
trap 'stop_all' EXIT

XFER_BIN=${XFER:-$REPO/target/release/xfer}
if [ ! -x "$XFER_BIN" ]; then
    log "no release binary at $XFER_BIN: running cargo build --release -p xfer"
    (cd "$REPO" && cargo build --release -p xfer) >&2 || die "cargo build --release -p xfer failed"
fi
! port_busy -u "$PORT" || die "UDP port $PORT is busy; set PORT"
fresh_dir "$RUN"
cd "$RUN"
"$XFER_BIN" keygen --out key >/dev/null

# start_agent ROOT [ARGS...]: one agent on 127.0.0.2, until it listens.
start_agent() {
    local root=$1
    shift
    fresh_dir "$root"
    "$XFER_BIN" serve --listen "127.0.0.2:$PORT" --root "$root" --key key "$@" >"$root.log" 2>&1 &
    AGENT=$!
    track "$AGENT"
    printf 'key = "key"\n\n[[node]]\nname = "n1"\nagent = "127.0.0.2:%s"\nroot = "%s"\n' "$PORT" "$root" >cluster.toml
    for ((i = 0; i < 300; i++)); do
        grep -q listening "$root.log" 2>/dev/null && return
        sleep 0.1
    done
    die "the agent did not start: $(tail -n 3 "$root.log")"
}
now() { date +%s.%N; }
median() { sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

# 1. ls on MODELS models.
start_agent "$RUN/root-ls"
log "pushing $MODELS small models"
for ((m = 1; m <= MODELS; m++)); do
    mkdir -p "src/m$m"
    head -c 4096 /dev/urandom >"src/m$m/weights.bin"
    echo '{}' >"src/m$m/config.json"
    XDG_CACHE_HOME=$RUN/xdg "$XFER_BIN" push "src/m$m" --cluster cluster.toml >/dev/null
done
ls_s=() status_s=()
for ((r = 0; r < RUNS; r++)); do
    t=$(now)
    count=$("$XFER_BIN" ls --cluster cluster.toml | grep -c '^  m')
    ls_s+=("$(echo "$(now) - $t" | bc -l)")
    [ "$count" -eq "$MODELS" ] || die "xfer ls listed $count of $MODELS models"
    t=$(now)
    "$XFER_BIN" status --cluster cluster.toml >/dev/null || true
    status_s+=("$(echo "$(now) - $t" | bc -l)")
done
stop_pid "$AGENT"
ls_med=$(printf '%s\n' "${ls_s[@]}" | median)
status_med=$(printf '%s\n' "${status_s[@]}" | median)

# 2. A push that evicts first against one with room.
budget=$((SIZE_MIB * 5 / 2))
for b in 1 2 3; do
    mkdir -p "big/b$b"
    head -c $((SIZE_MIB << 20)) /dev/urandom >"big/b$b/weights.bin"
done
room_s=() evict_s=()
for ((r = 0; r < RUNS; r++)); do
    start_agent "$RUN/root-evict" --max-bytes "${budget}MiB" --evict-above 100%
    push() { XDG_CACHE_HOME=$RUN/xdg "$XFER_BIN" push "big/$1" --cluster cluster.toml >/dev/null; }
    push b1
    t=$(now)
    push b2
    room_s+=("$(echo "$(now) - $t" | bc -l)")
    t=$(now)
    push b3
    evict_s+=("$(echo "$(now) - $t" | bc -l)")
    grep -q "evicted b1" "$RUN/root-evict.log" || die "b3's push did not evict b1: $(tail -n 5 "$RUN/root-evict.log")"
    [ ! -e "$RUN/root-evict/b1" ] || die "b1 is still there"
    stop_pid "$AGENT"
done
room_med=$(printf '%s\n' "${room_s[@]}" | median)
evict_med=$(printf '%s\n' "${evict_s[@]}" | median)

{
    echo "| case | xfer | baseline | ratio |"
    echo "|---|---:|---:|---:|"
    printf '| `xfer ls` of %d models, s (median of %d) | %.3f | one `xfer status` %.3f | %.2f |\n' \
        "$MODELS" "$RUNS" "$ls_med" "$status_med" "$(echo "$ls_med / $status_med" | bc -l)"
    printf '| push %d MiB that evicts %d MiB first, s | %.3f | the same push with room %.3f | %.2f |\n' \
        "$SIZE_MIB" "$SIZE_MIB" "$evict_med" "$room_med" "$(echo "$evict_med / $room_med" | bc -l)"
} | tee -a "$ST_DIR/summary.txt"
