# shellcheck shell=bash
# Helpers shared by the benchmark scripts: logging, installing missing
# tools, number formatting, tracking and stopping our own child processes,
# CPU counters, the cached model-like source tree, and (below) the cluster,
# agent and push steps of the network benches (bench-fanout.sh,
# bench-scale.sh).
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
            wait "$p" 2>/dev/null || true
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

# proc_times PID: "utime stime" of PID in clock ticks (fields 14 and 15 of
# /proc/PID/stat), for the kernel's share of a process's CPU time.
proc_times() {
    sed 's/^.*) //' "/proc/$1/stat" | awk '{ printf "%.0f %.0f\n", $12, $13 }'
}
# cpu_idle_total: "idle total" jiffies of the whole machine from /proc/stat
# (idle counts idle + iowait; total the first eight fields). Take it before
# and after, and the idle share is the ratio of the deltas.
cpu_idle_total() {
    awk '$1 == "cpu" { printf "%.0f %.0f\n", $5 + $6, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9; exit }' /proc/stat
}
# idle_since "IDLE TOTAL": CPU idle % since that cpu_idle_total reading.
idle_since() {
    local a b c d
    read -r a b <<<"$1"
    read -r c d < <(cpu_idle_total)
    awk -v i=$((c - a)) -v t=$((d - b)) 'BEGIN { if (t > 0) printf "%.0f", 100 * i / t; else print "n/a" }'
}
# registry_up NS ADDR DIR: Debian's docker-registry (CNCF distribution,
# plain HTTP) in network namespace NS on ADDR, storing under DIR, its
# output in DIR/out.log; waits until /v2/ answers (10 s at most). Sets
# REG_PID (the caller stops it).
registry_up() {
    local ns=$1 addr=$2 dir=$3 k
    mkdir -p "$dir"
    printf 'version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: false\nstorage:\n  filesystem:\n    rootdirectory: %s/data\nhttp:\n  addr: %s\n' \
        "$dir" "$addr" >"$dir/config.yml"
    ip netns exec "$ns" docker-registry serve "$dir/config.yml" >"$dir/out.log" 2>&1 &
    REG_PID=$!
    for ((k = 0; k < 100; k++)); do
        ip netns exec "$ns" curl -sf "http://$addr/v2/" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    die "the registry on $addr did not answer: $(tail -n3 "$dir/out.log")"
}
# percentile P VALUE...: the nearest-rank P-th percentile (P in 1..100).
percentile() {
    local p=$1
    shift
    if [ $# -eq 0 ]; then
        echo n/a
        return
    fi
    printf '%s\n' "$@" | sort -g | awk -v p="$p" '{ a[NR] = $1 } END { r = int((p * NR + 99) / 100); if (r < 1) r = 1; print a[r] }'
}

# ------------------------------------------------------------------------
# Shared by the network benchmarks on a netcluster.sh cluster
# (bench-fanout.sh, bench-scale.sh). They use these globals: BENCH_DIR (the
# bench's folder: source trees, host roots h<i>/, run/), RUN (this run's
# logs, JSON, binary and key), NC (netcluster.sh), REPO, KEEP_RUN, and set
# CLUSTER_UP=1 once the cluster may exist.

posint() { [[ $1 =~ ^[0-9]+$ && $1 -ge 1 ]]; }
check_rate_size() { # check_rate_size RATE SIZE
    posint "$1" || die "RATE_MBIT must be a positive integer (got '$1')"
    if ! posint "$2" || [ "$2" -lt 8 ]; then die "SIZE_MIB must be an integer >= 8 (got '$2')"; fi
}
mib() { awk -v b="$1" 'BEGIN { if (b == "" || b == "-" || b == "null") print "-"; else printf "%.1f", b / 1048576 }'; }

# netbench_preflight: root, the tools every network bench uses, BENCH_DIR on disk.
netbench_preflight() {
    [ "$(id -u)" = 0 ] || die "must run as root (network namespaces, tc, apt-get): use sudo or a root shell"
    [ -x "$NC" ] || die "$NC missing or not executable"
    need /usr/bin/time time
    need jq jq
    need b3sum b3sum
    need ss iproute2
    need tc iproute2
    need timeout coreutils
    need flock util-linux
    need ping iputils-ping
    mkdir -p "$BENCH_DIR"
    [ "$(stat -f -c %T "$BENCH_DIR")" != tmpfs ] ||
        die "$BENCH_DIR is on tmpfs; point the bench's folder at a directory on disk"
}

# find_xfer: XFER_BIN (XFER, else the release build) and XFER_REV.
find_xfer() {
    local target=${CARGO_TARGET_DIR:-$REPO/target}
    XFER_BIN=${XFER:-$target/release/xfer}
    [ -x "$XFER_BIN" ] || die "xfer binary not found at $XFER_BIN: run cargo build --release -p xfer (or set XFER=/path/to/xfer)"
    if [ -z "${XFER:-}" ] && [ -n "$(find "$REPO/xfer/src" -newer "$XFER_BIN" -name '*.rs' -print -quit 2>/dev/null)" ]; then
        log "warning: $XFER_BIN is older than xfer/src; run cargo build --release -p xfer to measure the current code"
    fi
    XFER_REV=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
    if [ -n "$(git -C "$REPO" status --porcelain -- xfer/src 2>/dev/null)" ]; then XFER_REV+=+dirty; fi
    if [ -n "${XFER:-}" ]; then XFER_REV="XFER=$XFER"; fi
}

# stage_xfer: copies XFER_BIN to $RUN/xfer (a rebuild elsewhere cannot swap
# the binary mid-run) and makes the cluster key $RUN/cluster.key.
stage_xfer() {
    cp "$XFER_BIN" "$RUN/xfer"
    "$RUN/xfer" keygen --out "$RUN/cluster.key" >/dev/null
}

# netbench_cleanup: the EXIT trap: stops our children, removes the cluster
# and the host roots, keeps $RUN on failure or with KEEP_RUN=1.
CLUSTER_UP=0
netbench_cleanup() {
    local rc=$?
    set +e
    trap - EXIT INT TERM
    stop_all
    if [ "$CLUSTER_UP" = 1 ]; then "$NC" down; fi
    rm -rf "$BENCH_DIR"/h[0-9]*
    if [ "$rc" != 0 ]; then
        log "FAILED (exit $rc); logs, JSON and configs kept in $RUN"
    elif [ "$KEEP_RUN" = 1 ]; then
        log "logs kept in $RUN"
    else
        rm -rf "$RUN"
    fi
    exit "$rc"
}

# fingerprint DIR: "blake3  relative/path" of every file, sorted.
fingerprint() {
    (cd "$1" && find . -type f -printf '%P\0' | sort -z | xargs -0 -r b3sum --num-threads 2 --)
}
# verify_tree WHAT DIR: DIR must hold exactly the files and bytes listed in
# $RUN/fp-source.txt (the caller writes it with fingerprint).
verify_tree() {
    local what=$1 dir=$2 out
    out=$RUN/fp-$(echo "$what" | tr -c 'a-z0-9\n' '-').txt
    [ -d "$dir" ] || die "$what: $dir does not exist; the copy never arrived (see $RUN)"
    fingerprint "$dir" >"$out"
    if ! cmp -s "$RUN/fp-source.txt" "$out"; then
        diff "$RUN/fp-source.txt" "$out" | head -n 6 >&2 || true
        die "$what: $dir differs from the source (b3sum lists in $RUN/fp-source.txt and $out)"
    fi
}
# link_bytes N IF: bytes all hosts 0..N have sent on IF (eth0: management,
# eth1: fabric), by their tbf qdiscs; each packet between hosts counts once.
link_bytes() {
    local n=$1 dev=$2 i sum=0
    for ((i = 0; i <= n; i++)); do sum=$((sum + $("$NC" bytes "$i" "$dev"))); done
    echo "$sum"
}

# start_agent I LISTEN ROOT: `xfer serve` on host I, logs in
# $RUN/agent-I.{out,err}; its pid goes to AGENT_PIDS[I] and is tracked.
AGENT_PIDS=()
start_agent() {
    local i=$1
    "$NC" exec "$i" "$RUN/xfer" serve --listen "$2" --root "$3" --key "$RUN/cluster.key" \
        >"$RUN/agent-$i.out" 2>"$RUN/agent-$i.err" &
    AGENT_PIDS[i]=$!
    track "${AGENT_PIDS[i]}"
}
# wait_agent I: until agent I says it listens (dies if it exits or 15 s pass).
wait_agent() {
    local i=$1 tries
    for ((tries = 0; tries < 150; tries++)); do
        if grep -q 'xfer agent listening' "$RUN/agent-$i.out"; then return 0; fi
        kill -0 "${AGENT_PIDS[i]}" 2>/dev/null || die "agent on host $i exited at start: $(tail -n3 "$RUN/agent-$i.err" | tr '\n' ' ')"
        sleep 0.1
    done
    die "agent on host $i did not print 'xfer agent listening' within 15 s (see $RUN/agent-$i.err)"
}
# note_agent_log I: one log line if agent I logged a WARN or ERROR.
note_agent_log() {
    if grep -Eq ' (WARN|ERROR) ' "$RUN/agent-$1.err"; then
        log "note: agent $1 logged: $(grep -E ' (WARN|ERROR) ' "$RUN/agent-$1.err" | head -n 2 | tr '\n' ' ')"
    fi
}

# run_push SRC TO TIMEOUT_S: host 0 runs `xfer push SRC --to TO --json
# --rehash $PUSH_ARGS` under /usr/bin/time ($RUN/push.{json,err,time}: wall,
# peak RSS KiB, user s, sys s). Sets PUSH_RC, PUSH_T0 and PUSH_T1 (epoch
# seconds around it). XDG_CACHE_HOME should be private to the run.
# shellcheck disable=SC2034 # PUSH_T0 and PUSH_T1 are for the caller
run_push() {
    PUSH_RC=0
    PUSH_T0=$EPOCHREALTIME
    # In the background and waited for, so a TERM or INT reaches the trap at once.
    # shellcheck disable=SC2086 # PUSH_ARGS is a list of words
    /usr/bin/time -f '%e %M %U %S' -o "$RUN/push.time" \
        "$NC" exec 0 timeout -s INT "$3" "$RUN/xfer" push "$1" --to "$2" --key "$RUN/cluster.key" --json --rehash ${PUSH_ARGS:-} \
        >"$RUN/push.json" 2>"$RUN/push.err" &
    local ppid=$!
    track "$ppid"
    wait "$ppid" || PUSH_RC=$?
    PUSH_T1=$EPOCHREALTIME
    untrack "$ppid"
}
# check_push BYTES TIMEOUT_S: dies unless the push exited 0, printed JSON,
# every node is ok and bytes_total is BYTES; with KILLED_ADDRS (one
# ADDR:PORT per line), it exited 1 and exactly those nodes failed. Sets SRC_X (the source's bytes
# over S) and SRC_X_FROM (where that figure came from).
# shellcheck disable=SC2034 # SRC_X and SRC_X_FROM are for the caller
check_push() {
    local bytes=$1 timeout_s=$2 why j_total j_ok
    if [ -n "${KILLED_ADDRS:-}" ] && [ "$PUSH_RC" = 1 ] && jq -e . "$RUN/push.json" >/dev/null 2>&1; then
        # Churn: the push fails for the killed agents, and only for them.
        local bad
        bad=$(jq -r '.nodes[] | select(.ok | not) | .addr' "$RUN/push.json" | sort)
        [ "$bad" = "$(sort <<<"$KILLED_ADDRS")" ] || die "with churn, the failed nodes were [${bad//$'\n'/ }], expected the killed [${KILLED_ADDRS//$'\n'/ }]"
        SRC_X=$(jq -r '.source_sent_x' "$RUN/push.json")
        SRC_X_FROM=source_sent_x
        return 0
    fi
    if [ "$PUSH_RC" != 0 ]; then
        why=$(jq -r '.nodes[]? | select(.ok | not) | "\(.addr): \(.error)"' "$RUN/push.json" 2>/dev/null | head -n 3 | tr '\n' ' ' || true)
        [ "$PUSH_RC" != 124 ] || why="no result after ${timeout_s}s (set PUSH_TIMEOUT to wait longer) $why"
        die "xfer push exited $PUSH_RC: ${why:-$(tail -n 3 "$RUN/push.err" | tr '\n' ' ')}"
    fi
    jq -e . "$RUN/push.json" >/dev/null 2>&1 || die "xfer push printed no JSON summary (see $RUN/push.json, $RUN/push.err)"
    read -r j_total j_ok < <(jq -r '[.bytes_total, ([.nodes[].ok] | all)] | @tsv' "$RUN/push.json")
    [ "$j_ok" = true ] || die "xfer push reported a failed node: $(jq -c '[.nodes[] | select(.ok | not) | {addr, error}]' "$RUN/push.json")"
    [ "$j_total" = "$bytes" ] || die "xfer push reports bytes_total $j_total, the tree holds $bytes"
    if jq -e 'has("source_sent_x")' "$RUN/push.json" >/dev/null; then
        SRC_X=$(jq -r '.source_sent_x' "$RUN/push.json")
        SRC_X_FROM=source_sent_x
    else
        SRC_X=$(jq -r '.bytes_sent / .bytes_total' "$RUN/push.json")
        SRC_X_FROM="bytes_sent/bytes_total; this xfer's JSON has no source_sent_x"
    fi
}

# hub_port PREFIX PID: the Hub look-alike's port once it printed `READY
# <hub_port> <cdn_port>` to PREFIX.out (at most 120 s); dies with the tail
# of PREFIX.err if PID exits first.
hub_port() {
    local k
    for ((k = 0; k < 1200; k++)); do
        grep -qs '^READY ' "$1.out" && break
        kill -0 "$2" 2>/dev/null || die "hub_server.py exited: $(tail -n3 "$1.err")"
        sleep 0.1
    done
    awk '/^READY / { print $2; exit }' "$1.out" | grep . || die "hub_server.py did not say READY within 120 s"
}

# ------------------------------------------------------- bench repos ----
# A Hub repo of random safetensors shards, for the Hub look-alike
# (tests/hub_server.py); the caller sets REPOS.

# le64 N: N as 8 little-endian bytes (the safetensors header length).
le64() {
    local i out=""
    for ((i = 0; i < 8; i++)); do out+=$(printf '\\%03o' $((($1 >> (8 * i)) & 255))); done
    printf '%b' "$out"
}
# shard_header NAME N: safetensors header for one U8 tensor of N bytes,
# padded with spaces to a multiple of 8 as the format recommends.
shard_header() {
    local h
    h=$(printf '{"__metadata__":{"format":"pt"},"%s":{"dtype":"U8","shape":[%d],"data_offsets":[0,%d]}}' "$1" "$2" "$2")
    printf '%-*s' $((((${#h} + 7) / 8) * 8)) "$h"
}
shard_name() { printf 'model-%05d-of-%05d.safetensors' "$1" "$2"; }
shard_bytes() { # shard_bytes I N MIB: shard I's file size; the shards add up to MIB MiB
    local total=$(($3 << 20))
    local each=$((total / $2))
    if [ "$1" = "$2" ]; then echo $((total - each * ($2 - 1))); else echo "$each"; fi
}

# gen_repo ORG/NAME MIB SHARDS: the repo folder $REPOS/ORG/NAME with
# config.json, tokenizer.json (256 KiB), model.safetensors.index.json and
# SHARDS valid safetensors shards of random bytes adding up to MIB MiB.
# Kept while its spec and shard sizes match, else made anew.
gen_repo() {
    local id=$1 mib=$2 shards=$3
    local dir=$REPOS/$id spec=$REPOS/${id%%/*}/.${id#*/}.spec
    local want="size_mib=$mib shards=$shards v1"
    local i ok=1
    if [ -f "$spec" ] && [ "$(cat "$spec")" = "$want" ]; then
        for ((i = 1; i <= shards; i++)); do
            [ "$(stat -c %s "$dir/$(shard_name "$i" "$shards")" 2>/dev/null)" = "$(shard_bytes "$i" "$shards" "$mib")" ] || ok=0
        done
        for f in config.json tokenizer.json model.safetensors.index.json; do [ -f "$dir/$f" ] || ok=0; done
        if [ "$ok" = 1 ]; then
            log "repo $id: $mib MiB in $shards shards, cached in $dir"
            return
        fi
    fi
    log "generating repo $id: $mib MiB of random data in $shards shards in $dir"
    rm -rf "$dir" "$spec"
    mkdir -p "$dir"
    local name bytes tensor hdr n map="" total=0
    for ((i = 1; i <= shards; i++)); do
        name=$(shard_name "$i" "$shards")
        bytes=$(shard_bytes "$i" "$shards" "$mib")
        tensor=model.layers.$((i - 1)).weight
        n=$((bytes - 8 - 256)) # the header length depends on n's digits: settle it
        while :; do
            hdr=$(shard_header "$tensor" "$n")
            [ $((8 + ${#hdr} + n)) != "$bytes" ] || break
            n=$((bytes - 8 - ${#hdr}))
        done
        {
            le64 "${#hdr}"
            printf '%s' "$hdr"
            head -c "$n" /dev/urandom
        } >"$dir/$name"
        map+="${map:+,}\"$tensor\":\"$name\""
        total=$((total + n))
    done
    printf '{"metadata":{"total_size":%d},"weight_map":{%s}}\n' "$total" "$map" >"$dir/model.safetensors.index.json"
    printf '{"architectures":["BenchForCausalLM"],"model_type":"bench","hidden_size":4096,"num_hidden_layers":%d,"torch_dtype":"uint8"}\n' \
        "$shards" >"$dir/config.json"
    {
        printf '{"version":"1.0","model":{"type":"BPE","blob":"'
        head -c 196608 /dev/urandom | base64 -w0
        printf '"}}\n'
    } >"$dir/tokenizer.json"
    sync
    echo "$want" >"$spec"
}
