# shellcheck shell=bash
# Helpers shared by the benchmark scripts (bench-push.sh, bench-fanout.sh):
# logging, installing missing tools, number formatting, tracking and stopping
# our own child processes, and the cached model-like source tree.
# Source this file; it only defines functions and defaults.
# The caller sets BENCH_DIR (cache root) before calling gen_tree; LOG_TAG
# names the script in log lines.

LOG_TAG=${LOG_TAG:-bench}
MODEL_NAME=${MODEL_NAME:-bench-model}
PIDS=()

log() { printf '[%s %(%H:%M:%S)T] %s\n' "$LOG_TAG" -1 "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

APT_UPDATED=0
need() { # need COMMAND-OR-PATH DEBIAN-PACKAGE
    if ! command -v "$1" >/dev/null 2>&1; then
        log "installing $2 (for $1)"
        if [ "$APT_UPDATED" = 0 ]; then
            DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
            APT_UPDATED=1
        fi
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$2" >&2
        command -v "$1" >/dev/null 2>&1 || die "$1 still missing after installing $2"
    fi
}

# Child processes to stop on exit: track PID after starting one, stop_pid PID.
track() { PIDS+=("$1"); }
untrack() {
    local p keep=()
    for p in "${PIDS[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
    PIDS=("${keep[@]}")
}
# True when PID is still alive and still our own child (never signal a
# recycled PID that now belongs to someone else).
our_child() {
    [ -r "/proc/$1/stat" ] || return 1
    local ppid
    ppid=$(sed 's/^.*) //' "/proc/$1/stat" | awk '{print $2}')
    [ "$ppid" = "$$" ]
}
stop_pid() {
    if our_child "$1"; then
        kill_tree "$1"
        wait "$1" 2>/dev/null || true
    fi
    untrack "$1"
}
# Stops every tracked child still running (for an EXIT trap).
stop_all() {
    local p
    for p in "${PIDS[@]}"; do
        if our_child "$p"; then
            kill_tree "$p"
            wait "$p" 2>/dev/null
        fi
    done
}
# kill_tree PID: stop PID and its descendants (rsync clients run under
# /usr/bin/time and timeout, rsync daemons fork per connection): TERM to all
# of them, KILL to whoever is left after a second. The tree is listed first,
# as children orphaned by their parent's exit can no longer be found.
descendants() {
    local c
    for c in $(pgrep -P "$1" 2>/dev/null); do
        echo "$c"
        descendants "$c"
    done
}
kill_tree() {
    local all=() p i
    mapfile -t all < <(echo "$1"; descendants "$1")
    kill "${all[@]}" 2>/dev/null || true
    for ((i = 0; i < 10; i++)); do
        for p in "${all[@]}"; do [ ! -e "/proc/$p" ] || break; done
        [ -e "/proc/$p" ] || return 0
        sleep 0.1
    done
    kill -KILL "${all[@]}" 2>/dev/null || true
}

port_busy() { # port_busy PROTO-FLAG PORT
    [ -n "$(ss -Hn"$1"l "sport = :$2" 2>/dev/null)" ]
}

calc() { awk "BEGIN { printf \"%.6f\", $1 }"; }
fmt() { # fmt PRINTF-FORMAT VALUE  (n/a passes through)
    if [[ $2 == n/a || -z $2 ]]; then echo "n/a"; else awk -v v="$2" "BEGIN { printf \"$1\", v }"; fi
}
ratio() { # ratio A B
    if [[ $1 == n/a || $2 == n/a || -z $1 || -z $2 ]]; then
        echo n/a
    else
        awk -v a="$1" -v b="$2" 'BEGIN { if (b == 0) print "n/a"; else printf "%.2f", a / b }'
    fi
}
median() {
    if [ $# -eq 0 ]; then
        echo n/a
        return
    fi
    printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { if (NR % 2) m = a[(NR + 1) / 2]; else m = (a[NR / 2] + a[NR / 2 + 1]) / 2; printf "%.6f\n", m }'
}
maxof() {
    if [ $# -eq 0 ]; then echo n/a; else printf '%s\n' "$@" | sort -g | tail -n1; fi
}
elapsed() { calc "$2 - $1"; }

# proc_ticks PID [1]: utime+stime of PID in clock ticks (with 1: plus the
# cutime+cstime of its reaped children). Fields 14-17 of /proc/PID/stat,
# counted after the ")" that closes the command name.
proc_ticks() {
    local rest
    rest=$(sed 's/^.*) //' "/proc/$1/stat")
    if [ "${2:-0}" = 1 ]; then
        awk '{ printf "%.0f\n", $12 + $13 + $14 + $15 }' <<<"$rest"
    else
        awk '{ printf "%.0f\n", $12 + $13 }' <<<"$rest"
    fi
}

tree_bytes() { find "$1" -type f -printf '%s\n' | awk '{ s += $1 } END { printf "%.0f\n", s }'; }
warm() { find "$1" -type f -exec cat {} + >/dev/null; }
fresh_dir() {
    rm -rf "$1"
    mkdir -p "$1"
    sync
}
timed_sync() {
    local t0=$EPOCHREALTIME
    sync
    elapsed "$t0" "$EPOCHREALTIME"
}

# gen_tree MB: a model-like tree of MB MiB, cached in BENCH_DIR; prints its path.
# Four safetensors shards of random bytes (odd sizes, so chunks never line up
# with file ends), the index and config JSON files, a tokenizer, a nested
# folder and an empty file.
gen_tree() {
    local mb=$1
    local base=$BENCH_DIR/src-${mb}M
    local dir=$base/$MODEL_NAME
    if [ -f "$base/.complete" ]; then
        echo "$dir"
        return
    fi
    local avail_mb
    avail_mb=$(df -Pm "$BENCH_DIR" | awk 'NR == 2 { print $4 }')
    [ "$avail_mb" -gt $((mb * 3)) ] || die "need $((mb * 3)) MiB free in $BENCH_DIR for a $mb MiB tree and its copies"
    log "generating a $mb MiB model tree in $dir"
    rm -rf "$base"
    mkdir -p "$dir/original"
    local small=$((1 << 20))
    local shard=$((((mb << 20) - 2 * small) / 4))
    local i name map=""
    for i in 1 2 3 4; do
        name=$(printf 'model-%05d-of-%05d.safetensors' "$i" 4)
        head -c $((shard + i * 4099)) /dev/urandom >"$dir/$name"
        map+="${map:+, }\"layers.$i.weight\": \"$name\""
    done
    printf '{"metadata": {}, "weight_map": {%s}}\n' "$map" >"$dir/model.safetensors.index.json"
    printf '{"architectures": ["BenchForCausalLM"], "hidden_size": 4096, "torch_dtype": "bfloat16"}\n' >"$dir/config.json"
    head -c "$small" /dev/urandom >"$dir/tokenizer.json"
    head -c "$small" /dev/urandom >"$dir/original/consolidated.00.pth"
    printf '{"dim": 4096}\n' >"$dir/original/params.json"
    : >"$dir/generation_config.json"
    touch "$base/.complete"
    echo "$dir"
}
