#!/usr/bin/env bash
# Pull benchmark: `xfer pull` against huggingface_hub's `hf download`, both
# from the same local Hub-protocol server (tests/hub_server.py) that caps each
# connection's rate, as public CDNs do; then the time to get a repo onto 2
# nodes, pull-then-push against pull-with-fan-out, over shaped netns links.
#
#   scripts/bench-pull.sh [all|pull|fanout|mirror|stripes]   (default: all)
#
#   stripes scripts/bench-stripes.sh: every node fetching its own ranges
#           from the Hub (`xfer sync --from all`, issue 36) against one
#           node's intake, on N nodes with their own internet links; not
#           part of `all` (its own cluster and about 6 minutes).
#   pull    A multi-shard repo of SIZE_MIB (bench/model-2g). Each run
#           downloads it into a fresh empty HF_HUB_CACHE with `hf download`
#           and with `xfer pull --json`, page cache dropped before each
#           (RUNS runs, the order alternating). Prints seconds, MB/s and peak
#           RSS per tool (medians), how many bodies the server sent at once,
#           and hf_s / xfer_s; the floor is 2.0 (PASS / BELOW FLOOR). hf
#           downloads one file per connection (at most 8 workers), so it can
#           never beat largest shard / RATE; xfer splits files into ranged
#           parts over CONNECTIONS connections. Both snapshots must hold the
#           source's bytes (b3sum).
#   fanout  scripts/netcluster.sh cluster of hosts 0..max(FAN_NODES) (PREFIX
#           xfp), links shaped to LINK_MBIT; the server runs inside host 0
#           (its loopback is unshaped) with FAN_RATE per connection; agents
#           on hosts 1..N. A FAN_SIZE_MIB repo (bench/model-1g) is moved, for
#           each node count N in FAN_NODES, four ways:
#             D           xfer pull alone on host 0
#             sequential  xfer pull, then xfer push of models--bench--model-1g
#             files       xfer pull --to --fan-out files (whole files in push
#                         rounds while the rest downloads: the older way)
#             streamed    xfer pull --to (each verified chunk as it lands)
#           against F_ideal = S / link rate and ideal = max(D, F_ideal).
#           Goal: streamed <= 1.10 x ideal for 2 nodes, 1.15 x for more, and
#           every node's first_byte_s (first downloaded byte to its first
#           verified chunk) under 1 s. Every agent's folder must equal host
#           0's (b3sum and diff -r --no-dereference) and every way must
#           deliver the same root.
#   mirror  A fast LAN mirror, no rate cap: a MIRROR_SIZE_MIB repo
#           (bench/model-256m, MIRROR_SHARDS shards) served first by
#           tests/hub_server.py (honours Range), then by a real olah mirror
#           (scripts/olah-mirror.sh; olah 0.5.4 answers a Range request on a
#           local mirror with the whole file). MIRROR_RUNS runs per server,
#           the first right after the server started (cold), the order
#           alternating, fresh caches, page cache dropped before each. Both
#           clients at their defaults, as a new user runs them. Floor: xfer
#           pull <= 1.0 x hf download in every run (PASS / BELOW FLOOR).
#
# Prints one summary block (Markdown) to paste into a README, appends it to
# $PULL_DIR/summary.txt and one row per part to $PULL_DIR/results.csv.
# Exit status 3 when everything ran but xfer is below the 2x floor.
#
# Env [default]: SIZE_MIB [2048], SHARDS [4], RATE [40000000 bytes/s per
# connection], CONNECTIONS [16] (xfer pull --connections), RUNS [1],
# LINK_MBIT [400], FAN_NODES ["2 4"], FAN_RATE [4000000: 16 x 4 MB/s = 64 MB/s, near the
# 50 MB/s links, so download and fan-out take about as long], FAN_SIZE_MIB
# [1024], FAN_SHARDS [4], XFER [target/release/xfer; built once with `cargo
# build --release -p xfer` if missing], HF_VENV [/var/tmp/xfer-venv-hf;
# created with huggingface_hub if missing], PULL_DIR [/var/tmp/xfer-bench-pull]
# (repos, caches, agent roots, results; disk, not tmpfs), PREFIX [xfp],
# PORT [17590] (agents, UDP), PULL_TIMEOUT [derived from the sizes and
# rates], KEEP_RUN [0] (1 keeps logs and JSON in $PULL_DIR/run),
# MIRROR_SIZE_MIB [256], MIRROR_SHARDS [2], MIRROR_RUNS [3], MIRROR_PORT
# [17591] (olah), OLAH [1] (0 skips the olah mirror).
#
# Runtime at the defaults on 2 cores: 2.6 min for `all` with RUNS=1, of which
# ~20 s make the repos the first time (random data and the server's hashes,
# both cached), pull ~35 s and fanout ~105 s per run. Needs root
# (drop_caches, network namespaces, apt-get for missing tools).

set -euo pipefail
shopt -s inherit_errexit
export LC_ALL=C

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPT_DIR/.." && pwd)
SELF=$SCRIPT_DIR/$(basename "${BASH_SOURCE[0]}")
LOG_TAG=pull
# shellcheck source=scripts/lib-bench.sh
source "$SCRIPT_DIR/lib-bench.sh"

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1' "$SELF" | sed 's/^# \{0,1\}//'; }

PART=${1:-all}
if [ "$PART" = stripes ]; then exec "$SCRIPT_DIR/bench-stripes.sh"; fi
case $PART in
all | pull | fanout | mirror) ;;
-h | --help | help)
    usage
    exit 0
    ;;
*)
    usage >&2
    exit 2
    ;;
esac
[ $# -le 1 ] || {
    usage >&2
    exit 2
}

SIZE_MIB=${SIZE_MIB:-2048}
SHARDS=${SHARDS:-4}
RATE=${RATE:-40000000}
CONNECTIONS=${CONNECTIONS:-16}
RUNS=${RUNS:-1}
LINK_MBIT=${LINK_MBIT:-400}
FAN_RATE=${FAN_RATE:-4000000}
FAN_SIZE_MIB=${FAN_SIZE_MIB:-1024}
FAN_SHARDS=${FAN_SHARDS:-4}
FAN_NODES=${FAN_NODES:-2 4}
FAN_MAX_NODES=0
for n in $FAN_NODES; do
    [[ $n =~ ^[0-9]+$ && $n -ge 1 && $n -le 8 ]] || { echo "FAN_NODES: node counts 1..8 (got '$n')" >&2; exit 2; }
    [ "$n" -le "$FAN_MAX_NODES" ] || FAN_MAX_NODES=$n
done
HF_VENV=${HF_VENV:-/var/tmp/xfer-venv-hf}
PULL_DIR=${PULL_DIR:-/var/tmp/xfer-bench-pull}
export PREFIX=${PREFIX:-xfp}
PORT=${PORT:-17590}
KEEP_RUN=${KEEP_RUN:-0}
MIRROR_SIZE_MIB=${MIRROR_SIZE_MIB:-256}
MIRROR_SHARDS=${MIRROR_SHARDS:-2}
MIRROR_RUNS=${MIRROR_RUNS:-3}
MIRROR_PORT=${MIRROR_PORT:-17591}
OLAH=${OLAH:-1}
MIRROR_REPO=bench/model-256m

PULL_REPO=bench/model-2g
FAN_REPO=bench/model-1g
HF_MAX_WORKERS=8 # hf download's default --max-workers
FLOOR=2.0
NC=$SCRIPT_DIR/netcluster.sh
REPOS=$PULL_DIR/repos
RUN=$PULL_DIR/run
CACHES=$PULL_DIR/caches
RESULTS=$PULL_DIR/results.csv
CSV_HEADER=stamp,xfer_rev,part,size_mib,shards,rate_Bps,connections,runs,hf_s,xfer_s,hf_over_xfer,link_mbit,d_s,f_ideal_s,ideal_s,seq_s,pipe_s,seq_over_ideal,pipe_over_ideal

posint() { [[ $1 =~ ^[0-9]+$ && $1 -ge 1 ]]; }
for v in SIZE_MIB SHARDS RATE CONNECTIONS RUNS LINK_MBIT FAN_RATE FAN_SIZE_MIB FAN_SHARDS PORT MIRROR_SIZE_MIB MIRROR_SHARDS MIRROR_RUNS MIRROR_PORT; do
    posint "${!v}" || die "$v must be a positive integer (got '${!v}')"
done
[ "$PORT" -le 65535 ] || die "PORT must be at most 65535 (got $PORT)"
[ "$SIZE_MIB" -ge "$SHARDS" ] || die "SIZE_MIB ($SIZE_MIB) must be >= SHARDS ($SHARDS)"
[ "$FAN_SIZE_MIB" -ge "$FAN_SHARDS" ] || die "FAN_SIZE_MIB ($FAN_SIZE_MIB) must be >= FAN_SHARDS ($FAN_SHARDS)"
if [ "$SHARDS" -gt 999 ] || [ "$FAN_SHARDS" -gt 999 ]; then die "at most 999 shards"; fi

# ------------------------------------------------------------ preflight ----

preflight() {
    [ "$(id -u)" = 0 ] || die "must run as root (drop_caches, network namespaces, apt-get): use sudo or a root shell"
    need /usr/bin/time time
    need python3 python3
    need jq jq
    need b3sum b3sum
    need curl curl
    need timeout coreutils
    need flock util-linux
    need diff diffutils
    if [ "$PART" = fanout ] || [ "$PART" = all ]; then
        [ -x "$NC" ] || die "$NC missing or not executable"
        need ip iproute2
        need tc iproute2
        need ping iputils-ping
    fi
    mkdir -p "$PULL_DIR"
    [ "$(stat -f -c %T "$PULL_DIR")" != tmpfs ] ||
        die "PULL_DIR=$PULL_DIR is on tmpfs; set PULL_DIR to a directory on disk"
    local avail need_mb=0
    avail=$(df -Pm "$PULL_DIR" | awk 'NR == 2 { print $4 }')
    # repo + 2 caches for pull; repo + cache + 2 agent copies for fanout (+ slack)
    if [ "$PART" = pull ] || [ "$PART" = all ]; then need_mb=$((SIZE_MIB * 3 + 512)); fi
    if [ "$PART" = fanout ] || [ "$PART" = all ]; then need_mb=$((need_mb + FAN_SIZE_MIB * (2 + FAN_MAX_NODES) + 512)); fi
    if [ "$PART" = mirror ] || [ "$PART" = all ]; then need_mb=$((need_mb + MIRROR_SIZE_MIB * 5 + 512)); fi
    [ "$avail" -gt "$need_mb" ] || die "need ~$need_mb MiB free in $PULL_DIR, have $avail; lower SIZE_MIB/FAN_SIZE_MIB or set PULL_DIR"
}

find_xfer() {
    XFER_BIN=${XFER:-$REPO/target/release/xfer}
    if [ ! -x "$XFER_BIN" ]; then
        [ -z "${XFER:-}" ] || die "XFER=$XFER is not an executable"
        command -v cargo >/dev/null 2>&1 || die "no $XFER_BIN and no cargo to build it"
        log "no release binary at $XFER_BIN: running cargo build --release -p xfer (takes several minutes)"
        (cd "$REPO" && CARGO_TARGET_DIR=$REPO/target cargo build --release -p xfer) >&2 ||
            die "cargo build --release -p xfer failed"
        [ -x "$XFER_BIN" ] || die "the build did not produce $XFER_BIN"
    elif [ -z "${XFER:-}" ] && [ -n "$(find "$REPO/xfer/src" -newer "$XFER_BIN" -name '*.rs' -print -quit 2>/dev/null)" ]; then
        log "warning: $XFER_BIN is older than xfer/src; run cargo build --release -p xfer to measure the current code"
    fi
    XFER_REV=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
    if [ -n "$(git -C "$REPO" status --porcelain -- xfer/src 2>/dev/null)" ]; then XFER_REV+=+dirty; fi
    if [ -n "${XFER:-}" ]; then XFER_REV="XFER=$XFER"; fi
}

find_hf() {
    if [ ! -x "$HF_VENV/bin/hf" ]; then
        log "creating $HF_VENV with huggingface_hub"
        python3 -m venv "$HF_VENV" >&2 || die "python3 -m venv $HF_VENV failed (apt-get install python3-venv?)"
        "$HF_VENV/bin/pip" install -q huggingface_hub >&2 || die "pip install huggingface_hub failed"
    fi
    HF_BIN=$HF_VENV/bin/hf
    [ -x "$HF_BIN" ] || die "$HF_BIN missing after installing huggingface_hub"
    HF_VERSION=$("$HF_VENV/bin/python" -c 'import huggingface_hub; print(huggingface_hub.__version__)')
}

# ----------------------------------------------------------------- repo ----

# le64, shard_header, shard_name, shard_bytes and gen_repo (the bench
# repos, made once under $REPOS) live in lib-bench.sh.

# ------------------------------------------------------------- helpers ----

CLUSTER_UP=0
cleanup() {
    local rc=$?
    set +e
    trap - EXIT INT TERM
    stop_all
    if [ -n "${OLAH_WORK:-}" ]; then "$SCRIPT_DIR/olah-mirror.sh" stop "$OLAH_WORK" 2>/dev/null || true; fi
    if [ "$rc" != 0 ] && [ "$A_DONE" = 1 ] && [ "$REPORTED" = 0 ]; then
        log "part A finished before the failure; its results:"
        B_DONE=0
        report
    fi
    if [ "$CLUSTER_UP" = 1 ]; then
        kill_ns_leftovers
        "$NC" down
    fi
    rm -rf "$CACHES" "$PULL_DIR"/h[0-9]*
    if [ "$rc" != 0 ] && [ "$rc" != 3 ]; then
        log "FAILED (exit $rc); logs and JSON kept in $RUN"
    elif [ "$KEEP_RUN" = 1 ] || [ "$rc" = 3 ]; then
        log "logs kept in $RUN"
    else
        rm -rf "$RUN"
    fi
    exit "$rc"
}
# Processes still inside our cluster's namespaces (all started by this run:
# the namespaces are this run's, under its lock); TERM, then KILL.
kill_ns_leftovers() {
    local h pids=()
    for h in $(ip netns list 2>/dev/null | awk '{ print $1 }' | grep -E "^$PREFIX-(h[0-9]+|sw)$" || true); do
        mapfile -t -O "${#pids[@]}" pids < <(ip netns pids "$h" 2>/dev/null || true)
    done
    [ "${#pids[@]}" -gt 0 ] || return 0
    log "stopping ${#pids[@]} leftover process(es) in the $PREFIX namespaces: ${pids[*]}"
    kill "${pids[@]}" 2>/dev/null || true
    sleep 1
    kill -KILL "${pids[@]}" 2>/dev/null || true
}

drop_caches() {
    sync
    if [ "$DROP_OK" = 1 ]; then echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || DROP_OK=0; fi
}

# fingerprint DIR [-L]: "blake3  relative/path" of every file, sorted; -L
# follows symlinks (snapshot folders), else symlinks are left to diff.
fingerprint() {
    local follow=()
    [ "${2:-}" != -L ] || follow=(-L)
    (cd "$1" && find "${follow[@]}" . -type f -printf '%P\0' | sort -z | xargs -0 -r b3sum --num-threads 2 --)
}
# same_fp WHAT EXPECTED-FILE DIR [-L]: DIR's fingerprint must equal EXPECTED-FILE.
same_fp() {
    local what=$1 want=$2 dir=$3 out
    out=$RUN/fp-$(echo "$what" | tr -c 'a-zA-Z0-9\n' '-').txt
    [ -d "$dir" ] || die "$what: $dir does not exist"
    fingerprint "$dir" "${4:-}" >"$out"
    if ! cmp -s "$want" "$out"; then
        diff "$want" "$out" | head -n 6 >&2 || true
        die "$what: $dir differs from the source (b3sum lists $want and $out)"
    fi
}
# snapshot CACHE ID: the one snapshot folder of repo ID in CACHE.
snapshot() {
    local d=$1/models--${2//\//--}/snapshots s=()
    mapfile -t s < <(find "$d" -mindepth 1 -maxdepth 1 -type d 2>/dev/null)
    [ "${#s[@]}" = 1 ] || die "expected one snapshot in $d, found ${#s[@]}"
    echo "${s[0]}"
}

# run_timed LABEL TIMEOUT CMD...: CMD under /usr/bin/time and timeout, its
# output in $RUN/LABEL.{out,err}. Sets T_S (wall seconds), T_RSS (peak RSS,
# KiB) and T_RC. In the background and waited for, so INT/TERM reach the trap.
run_timed() {
    local label=$1 tmo=$2 t0 pid
    shift 2
    T_RC=0
    t0=$EPOCHREALTIME
    /usr/bin/time -f '%e %M' -o "$RUN/$label.time" timeout -s INT "$tmo" "$@" \
        >"$RUN/$label.out" 2>"$RUN/$label.err" &
    pid=$!
    track "$pid"
    wait "$pid" || T_RC=$?
    T_S=$(elapsed "$t0" "$EPOCHREALTIME")
    untrack "$pid"
    T_RSS=$(awk 'END { print $2 }' "$RUN/$label.time" 2>/dev/null || echo 0)
    if [ "$T_RC" = 124 ]; then
        die "$label: no result after ${tmo}s (set PULL_TIMEOUT to wait longer); see $RUN/$label.err"
    fi
}
fail_tail() { tail -n 4 "$RUN/$1.err" | tr '\n' ' '; }

# start_hub LABEL RATE [HOST]: tests/hub_server.py over $REPOS, in the root
# namespace or (HOST given) inside cluster host HOST. Sets HUB_PID, HUB_URL.
start_hub() {
    local label=$1 rate=$2 host=${3:-} tries
    local cmd=(python3 -u "$REPO/tests/hub_server.py" --repos "$REPOS" --host 127.0.0.1 --rate "$rate")
    if [ -n "$host" ]; then cmd=("$NC" exec "$host" "${cmd[@]}"); fi
    "${cmd[@]}" >"$RUN/$label.out" 2>"$RUN/$label.err" &
    HUB_PID=$!
    track "$HUB_PID"
    # The first start hashes the repos (sha1 + sha256, cached in $REPOS).
    for ((tries = 0; tries < 3000; tries++)); do
        if grep -qs '^READY ' "$RUN/$label.out"; then break; fi
        kill -0 "$HUB_PID" 2>/dev/null || die "hub_server.py exited at start: $(fail_tail "$label")"
        sleep 0.1
    done
    grep -qs '^READY ' "$RUN/$label.out" || die "hub_server.py printed no READY within 300 s (see $RUN/$label.err)"
    HUB_URL=http://127.0.0.1:$(awk '/^READY / { print $2; exit }' "$RUN/$label.out")
    HUB_HOST=$host
}
# hub_curl ARGS...: curl against the hub server, in its namespace.
hub_curl() {
    if [ -n "$HUB_HOST" ]; then "$NC" exec "$HUB_HOST" curl -fsS "$@"; else curl -fsS "$@"; fi
}
stats_reset() { hub_curl -X POST "$HUB_URL/_stats/reset" >/dev/null; }
# stats FIELD: one counter of the server since the last reset.
stats() { hub_curl "$HUB_URL/_stats" | jq -r ".$1"; }

# The environment both clients see: no token, no proxies, our endpoint and
# a private HF_HOME; hf without Xet or hf_transfer, no progress bars.
client_env() { # client_env CACHE: prints NAME=VALUE words for env(1)
    printf '%s\n' "HF_ENDPOINT=$HUB_URL" "HF_HUB_CACHE=$1" "HF_HOME=$RUN/hf-home" \
        HF_HUB_DISABLE_XET=1 HF_HUB_DISABLE_PROGRESS_BARS=1 HF_HUB_DISABLE_TELEMETRY=1 \
        HF_HUB_DISABLE_UPDATE_CHECK=1 HF_HUB_DISABLE_IMPLICIT_TOKEN=1 \
        "XDG_CACHE_HOME=$RUN/xdg" NO_PROXY=127.0.0.1,localhost no_proxy=127.0.0.1,localhost
}
CLEAN_ENV=(-u HF_TOKEN -u HF_TOKEN_PATH -u HF_HUB_ENABLE_HF_TRANSFER -u HF_HUB_OFFLINE -u HF_XET_HIGH_PERFORMANCE
    -u http_proxy -u https_proxy -u HTTP_PROXY -u HTTPS_PROXY -u ALL_PROXY -u all_proxy -u RUST_LOG -u XFER_KEY)

# xfer_bound DIR RATE: S / (min(CONNECTIONS, ranged parts) x RATE), the
# parts being xfer pull's default --part-size (16 MiB) slices of each file.
xfer_bound() {
    local parts
    parts=$(find "$1" -type f -printf '%s\n' | awk -v p=$((16 << 20)) '{ n += int(($1 + p - 1) / p) } END { print n }')
    [ "$parts" -le "$CONNECTIONS" ] || parts=$CONNECTIONS
    calc "$(tree_bytes "$1") / ($parts * $2)"
}
mb_s() { awk -v b="$1" -v s="$2" 'BEGIN { if (s <= 0) print "n/a"; else printf "%.1f", b / s / 1e6 }'; }
mib() { awk -v k="$1" 'BEGIN { printf "%.0f", k / 1024 }'; }

# ------------------------------------------------------- part A: pull ----

A_DONE=0
part_pull() {
    local src=$REPOS/$PULL_REPO
    local bytes files maxfile
    bytes=$(tree_bytes "$src")
    files=$(find "$src" -type f | wc -l)
    maxfile=$(find "$src" -type f -printf '%s\n' | sort -n | tail -n1)
    fingerprint "$src" >"$RUN/fp-a-source.txt"
    # What the per-connection cap allows: hf fetches whole files, one per
    # connection, at most 8 at once; xfer keeps CONNECTIONS ranged requests.
    A_HF_BOUND=$(awk -v m="$maxfile" -v b="$bytes" -v r="$RATE" -v w="$HF_MAX_WORKERS" \
        'BEGIN { x = m / r; y = b / (w * r); printf "%.2f", (x > y ? x : y) }')
    A_XFER_BOUND=$(xfer_bound "$src" "$RATE")
    local tmo=${PULL_TIMEOUT:-$(awk -v s="$A_HF_BOUND" 'BEGIN { printf "%d", 10 * s + 180 }')}
    A_BYTES=$bytes
    A_FILES=$files

    log "part A: $PULL_REPO, $bytes bytes in $files files; server $(fmt %.0f "$(calc "$RATE / 1e6")") MB/s per connection"
    start_hub hub-a "$RATE"
    log "hub server at $HUB_URL (root namespace)"
    local r tool order
    A_HF_S=() A_XFER_S=() A_HF_RSS=() A_XFER_RSS=() A_HF_CONC=() A_XFER_CONC=() A_RATIOS=()
    for ((r = 1; r <= RUNS; r++)); do
        if ((r % 2)); then order="hf xfer"; else order="xfer hf"; fi
        local hf_s="" xfer_s=""
        for tool in $order; do
            local cache=$CACHES/a-$tool label=a$r-$tool snap
            fresh_dir "$cache"
            rm -rf "$RUN/xdg"
            drop_caches
            stats_reset
            local envw=()
            mapfile -t envw < <(client_env "$cache")
            if [ "$tool" = hf ]; then
                run_timed "$label" "$tmo" env "${CLEAN_ENV[@]}" "${envw[@]}" "$HF_BIN" download "$PULL_REPO" --quiet
                [ "$T_RC" = 0 ] || die "hf download exited $T_RC: $(fail_tail "$label")"
            else
                run_timed "$label" "$tmo" env "${CLEAN_ENV[@]}" "${envw[@]}" \
                    "$XFER_BIN" pull "$PULL_REPO" --connections "$CONNECTIONS" --json
                [ "$T_RC" = 0 ] || die "xfer pull exited $T_RC: $(fail_tail "$label")"
                jq -e --argjson b "$bytes" '.verification.all_verified == true and .bytes_total == $b and .bytes_downloaded >= $b' \
                    "$RUN/$label.out" >/dev/null ||
                    die "xfer pull's JSON is not all_verified with bytes_total = bytes_downloaded = $bytes: $(head -c 600 "$RUN/$label.out")"
            fi
            local conc served
            conc=$(stats max_concurrent_bodies)
            served=$(stats bytes_served)
            snap=$(snapshot "$cache" "$PULL_REPO")
            same_fp "run $r $tool snapshot" "$RUN/fp-a-source.txt" "$snap" -L
            (cd "$cache/models--${PULL_REPO//\//--}" && find blobs refs snapshots -printf '%y %p %l\n' | sort) >"$RUN/layout-$tool.txt"
            find "$cache/models--${PULL_REPO//\//--}" -mindepth 1 -maxdepth 1 -printf '%P\n' | sort >"$RUN/top-$tool.txt"
            log "run $r $tool: $(fmt %.2f "$T_S") s, $(mb_s "$bytes" "$T_S") MB/s, peak RSS $(mib "$T_RSS") MiB, up to $conc bodies at once, served $(fmt %.3f "$(calc "$served / $bytes")") x S; snapshot verified"
            if [ "$tool" = hf ]; then
                hf_s=$T_S
                A_HF_S+=("$T_S") A_HF_RSS+=("$T_RSS") A_HF_CONC+=("$conc")
            else
                xfer_s=$T_S
                A_XFER_S+=("$T_S") A_XFER_RSS+=("$T_RSS") A_XFER_CONC+=("$conc")
            fi
        done
        if cmp -s "$RUN/layout-hf.txt" "$RUN/layout-xfer.txt"; then
            A_LAYOUT="blobs/, refs/ and snapshots/ identical in both caches (names, symlink targets)"
            local extra
            extra=$(comm -23 "$RUN/top-hf.txt" "$RUN/top-xfer.txt" | sed 's|$|/|' | paste -sd' ' -)
            [ -z "$extra" ] || A_LAYOUT+="; hf's cache also has $extra"
            extra=$(comm -13 "$RUN/top-hf.txt" "$RUN/top-xfer.txt" | sed 's|$|/|' | paste -sd' ' -)
            [ -z "$extra" ] || A_LAYOUT+="; xfer's cache also has $extra"
        else
            A_LAYOUT="cache folders differ in layout (see $RUN/layout-{hf,xfer}.txt)"
            log "note: hf and xfer cache folders differ: $(diff "$RUN/layout-hf.txt" "$RUN/layout-xfer.txt" | grep '^[<>]' | head -n 4 | tr '\n' ' ' || true)"
        fi
        rm -rf "$CACHES"/a-*
        A_RATIOS+=("$(ratio "$hf_s" "$xfer_s")")
        log "run $r: hf/xfer = ${A_RATIOS[-1]}"
    done
    stop_pid "$HUB_PID"
    A_HF=$(median "${A_HF_S[@]}")
    A_XFER=$(median "${A_XFER_S[@]}")
    A_RATIO=$(ratio "$A_HF" "$A_XFER")
    if awk -v r="$A_RATIO" -v f="$FLOOR" 'BEGIN { exit !(r >= f) }'; then A_VERDICT=PASS; else A_VERDICT="BELOW FLOOR"; fi
    A_DONE=1
}

# ----------------------------------------------------- part B: fanout ----

# start_agents N LABEL: fresh roots and one xfer serve per host 1..N, logs
# in $RUN/agent-I-LABEL.{out,err}.
AGENT_PID=() AGENT_LOG=() AGENTS_N=0
start_agents() {
    local n=$1 i tries
    stop_agents
    for ((i = 1; i <= FAN_MAX_NODES; i++)); do rm -rf "$PULL_DIR/h$i"; done
    for ((i = 1; i <= n; i++)); do mkdir -p "$PULL_DIR/h$i"; done
    sync
    AGENTS_N=$n
    for ((i = 1; i <= n; i++)); do
        AGENT_LOG[i]=agent-$i-$2
        "$NC" exec "$i" "$XFER_BIN" serve --listen "$("$NC" ip "$i"):$PORT" --root "$PULL_DIR/h$i" --key "$KEY" \
            >"$RUN/${AGENT_LOG[i]}.out" 2>"$RUN/${AGENT_LOG[i]}.err" &
        AGENT_PID[i]=$!
        track "${AGENT_PID[i]}"
    done
    for ((i = 1; i <= n; i++)); do
        for ((tries = 0; tries < 150; tries++)); do
            if grep -qs 'xfer agent listening' "$RUN/${AGENT_LOG[i]}.out"; then break; fi
            kill -0 "${AGENT_PID[i]}" 2>/dev/null || die "agent on host $i exited at start: $(fail_tail "${AGENT_LOG[i]}")"
            sleep 0.1
        done
        grep -qs 'xfer agent listening' "$RUN/${AGENT_LOG[i]}.out" || die "agent on host $i did not start within 15 s (see $RUN/${AGENT_LOG[i]}.err)"
    done
}
stop_agents() {
    local i
    for ((i = 1; i <= AGENTS_N; i++)); do
        if [ -n "${AGENT_PID[i]:-}" ]; then
            if grep -Eq ' (WARN|ERROR) ' "$RUN/${AGENT_LOG[i]}.err"; then
                log "note: agent $i logged: $(grep -E ' (WARN|ERROR) ' "$RUN/${AGENT_LOG[i]}.err" | head -n 2 | tr '\n' ' ')"
            fi
            stop_pid "${AGENT_PID[i]}"
            AGENT_PID[i]=""
        fi
    done
}
# verify_agents WHAT CACHE: every agent's NAME folder equals host 0's.
verify_agents() {
    local what=$1 folder=$2/$FAN_NAME i
    fingerprint "$folder" >"$RUN/fp-b-folder.txt"
    for ((i = 1; i <= AGENTS_N; i++)); do
        same_fp "$what agent $i" "$RUN/fp-b-folder.txt" "$PULL_DIR/h$i/$FAN_NAME"
        diff -r --no-dereference "$folder" "$PULL_DIR/h$i/$FAN_NAME" >"$RUN/diff-$what-$i.txt" 2>&1 ||
            die "$what: agent $i's folder differs from host 0's: $(head -n 4 "$RUN/diff-$what-$i.txt" | tr '\n' ' ')"
    done
}
# b_pull LABEL CACHE [ARGS...]: xfer pull of FAN_REPO on host 0 into CACHE.
b_pull() {
    local label=$1 cache=$2 envw=()
    shift 2
    mapfile -t envw < <(client_env "$cache")
    run_timed "$label" "$B_TMO" "$NC" exec 0 env "${CLEAN_ENV[@]}" "${envw[@]}" \
        "$XFER_BIN" pull "$FAN_REPO" --connections "$CONNECTIONS" --json "$@"
}
b_check_pull() { # b_check_pull LABEL JQ-PATH-TO-PULL-SUMMARY
    jq -e --argjson b "$B_BYTES" "$2 | .verification.all_verified == true and .bytes_total == \$b" "$RUN/$1.out" >/dev/null ||
        die "$1: xfer pull's JSON is not all_verified with bytes_total $B_BYTES: $(head -c 600 "$RUN/$1.out")"
}
# b_check_nodes LABEL N: the JSON of a push or pull --to lists N nodes,
# all ok with the summary's root.
b_check_nodes() {
    jq -e --argjson n "$2" '(.nodes | length == $n) and ([.nodes[].ok] | all) and ([.nodes[].root] | unique | length == 1) and (.nodes[0].root == .root)' "$RUN/$1.out" >/dev/null ||
        die "$1: not $2 nodes, all ok with one root: $(jq -c '[.root, [.nodes[]? | {addr, ok, root, error}]]' "$RUN/$1.out" 2>/dev/null || head -c 400 "$RUN/$1.out")"
}

# b_pipelined N R MODE: xfer pull --to the N agents, --fan-out MODE; the
# seconds, the download's, and for `stream` the slowest node's first_byte_s.
b_pipelined() {
    local n=$1 r=$2 mode=$3 cache=$CACHES/b label=b$2-n$1-$3 to="" i
    for ((i = 1; i <= n; i++)); do to+="${to:+,}$("$NC" ip "$i"):$PORT"; done
    fresh_dir "$cache"
    rm -rf "$RUN/xdg"
    start_agents "$n" "run$r-n$n-$mode"
    drop_caches
    b_pull "$label" "$cache" --to "$to" --key "$KEY" --fan-out "$mode"
    [ "$T_RC" = 0 ] || die "xfer pull --to --fan-out $mode exited $T_RC: $(jq -c '[.nodes[]? | select(.ok | not) | {addr, error}]' "$RUN/$label.out" 2>/dev/null || true) $(fail_tail "$label")"
    b_check_pull "$label" .pull
    b_check_nodes "$label" "$n"
    stop_agents
    verify_agents "$label" "$cache"
    same_fp "$label snapshot" "$RUN/fp-b-source.txt" "$(snapshot "$cache" "$FAN_REPO")" -L
    P_S=$T_S
    read -r P_DL P_SRCX P_FIRST P_TAIL P_NTAIL < <(jq -r '[.pull.duration_s, .source_sent_x, ([.nodes[].first_byte_s // 0] | max), .tail_s, ([.nodes[].tail_s // 0] | max)] | @tsv' "$RUN/$label.out")
    P_ROOT=$(jq -r .root "$RUN/$label.out")
    rm -rf "$cache"
}

# Results per node count N: arrays of per-run figures, by "N" key.
declare -A B_D B_SEQ B_SEQ_PULL B_SEQ_PUSH B_FILES B_STREAM B_STREAM_DL B_FIRST B_SRCX
B_DONE=0
part_fanout() {
    local src=$REPOS/$FAN_REPO i r n
    FAN_NAME=models--${FAN_REPO//\//--}
    B_BYTES=$(tree_bytes "$src")
    fingerprint "$src" >"$RUN/fp-b-source.txt"
    B_F_IDEAL=$(calc "$B_BYTES / ($LINK_MBIT * 1e6 / 8)")
    B_D_BOUND=$(xfer_bound "$src" "$FAN_RATE")
    B_TMO=${PULL_TIMEOUT:-$(awk -v a="$B_F_IDEAL" -v b="$B_D_BOUND" 'BEGIN { printf "%d", 6 * (a + b) + 180 }')}

    local busy
    busy=$(ip netns list 2>/dev/null | awk '{ print $1 }' | grep -E "^$PREFIX-h[0-9]+$" | while read -r h; do ip netns pids "$h"; done || true)
    [ -z "$busy" ] || die "namespaces $PREFIX-h* exist with processes in them (another run?); pick another PREFIX"
    log "part B: $FAN_REPO, $B_BYTES bytes; hosts 0..$FAN_MAX_NODES ($PREFIX-h*), $LINK_MBIT Mbit/s links; server in host 0 at $(fmt %.1f "$(calc "$FAN_RATE / 1e6")") MB/s per connection; node counts: $FAN_NODES"
    CLUSTER_UP=1
    "$NC" up "$FAN_MAX_NODES" "$LINK_MBIT"
    KEY=$RUN/cluster.key
    "$XFER_BIN" keygen --out "$KEY" >/dev/null
    start_hub hub-b "$FAN_RATE" 0
    log "hub server at $HUB_URL inside $PREFIX-h0"

    for ((r = 1; r <= RUNS; r++)); do
        local cache=$CACHES/b
        # D: the download alone
        fresh_dir "$cache"
        rm -rf "$RUN/xdg"
        drop_caches
        b_pull "b$r-d" "$cache"
        [ "$T_RC" = 0 ] || die "xfer pull (D) exited $T_RC: $(fail_tail "b$r-d")"
        b_check_pull "b$r-d" .
        same_fp "run $r D snapshot" "$RUN/fp-b-source.txt" "$(snapshot "$cache" "$FAN_REPO")" -L
        local d=$T_S
        log "run $r D: xfer pull alone $(fmt %.2f "$d") s ($(mb_s "$B_BYTES" "$d") MB/s)"
        for n in $FAN_NODES; do
            B_D[$n]+="$d "
            # sequential: pull, then push the cache folder
            local to="" t0 t1
            for ((i = 1; i <= n; i++)); do to+="${to:+,}$("$NC" ip "$i"):$PORT"; done
            fresh_dir "$cache"
            rm -rf "$RUN/xdg"
            start_agents "$n" "run$r-n$n-sequential"
            drop_caches
            t0=$EPOCHREALTIME
            b_pull "b$r-n$n-seq-pull" "$cache"
            [ "$T_RC" = 0 ] || die "xfer pull (sequential) exited $T_RC: $(fail_tail "b$r-n$n-seq-pull")"
            B_SEQ_PULL[$n]+="$T_S "
            run_timed "b$r-n$n-seq-push" "$B_TMO" "$NC" exec 0 env "${CLEAN_ENV[@]}" "XDG_CACHE_HOME=$RUN/xdg" \
                "$XFER_BIN" push "$cache/$FAN_NAME" --to "$to" --key "$KEY" --name "$FAN_NAME" --json
            t1=$EPOCHREALTIME
            [ "$T_RC" = 0 ] || die "xfer push (sequential) exited $T_RC: $(fail_tail "b$r-n$n-seq-push")"
            B_SEQ_PUSH[$n]+="$T_S "
            local seq
            seq=$(elapsed "$t0" "$t1")
            B_SEQ[$n]+="$seq "
            b_check_pull "b$r-n$n-seq-pull" .
            b_check_nodes "b$r-n$n-seq-push" "$n"
            stop_agents
            verify_agents "run$r-n$n-sequential" "$cache"
            local seq_root
            seq_root=$(jq -r .root "$RUN/b$r-n$n-seq-push.out")
            rm -rf "$cache"
            log "run $r, $n nodes, sequential: $(fmt %.2f "$seq") s; every agent verified"

            b_pipelined "$n" "$r" files
            B_FILES[$n]+="$P_S "
            [ "$P_ROOT" = "$seq_root" ] || die "$n nodes: files delivered root $P_ROOT, sequential $seq_root"
            log "run $r, $n nodes, pull --to --fan-out files: $(fmt %.2f "$P_S") s (download $(fmt %.2f "$P_DL") s)"

            b_pipelined "$n" "$r" stream
            B_STREAM[$n]+="$P_S " B_STREAM_DL[$n]+="$P_DL " B_FIRST[$n]+="$P_FIRST " B_SRCX[$n]+="$P_SRCX "
            [ "$P_ROOT" = "$seq_root" ] || die "$n nodes: stream delivered root $P_ROOT, sequential $seq_root"
            log "run $r, $n nodes, pull --to (stream): $(fmt %.2f "$P_S") s (download $(fmt %.2f "$P_DL") s; slowest first_byte_s $(fmt %.2f "$P_FIRST"); from the last downloaded byte: the slowest node complete $(fmt %.2f "$P_NTAIL") s, the command's end $(fmt %.2f "$P_TAIL") s; source sent $(fmt %.2f "$P_SRCX") x S)"
        done
    done
    stop_agents
    stop_pid "$HUB_PID"
    kill_ns_leftovers
    "$NC" down
    CLUSTER_UP=0
    B_DONE=1
}

# ----------------------------------------------------- part C: mirror ----

# mirror_run SERVER RUN: one hf download and one xfer pull of MIRROR_REPO
# from $HUB_URL, order alternating by RUN; appends to C_ROWS.
C_ROWS=() C_FAIL=0
mirror_run() {
    local server=$1 r=$2 order tool hf_s="" xfer_s="" src=$REPOS/$MIRROR_REPO
    if ((r % 2)); then order="hf xfer"; else order="xfer hf"; fi
    for tool in $order; do
        local cache=$CACHES/c-$tool label=c-$server$r-$tool envw=()
        fresh_dir "$cache"
        rm -rf "$RUN/xdg"
        drop_caches
        mapfile -t envw < <(client_env "$cache")
        if [ "$tool" = hf ]; then
            run_timed "$label" 600 env "${CLEAN_ENV[@]}" "${envw[@]}" "$HF_BIN" download "$MIRROR_REPO" --quiet
            [ "$T_RC" = 0 ] || die "hf download from $server exited $T_RC: $(fail_tail "$label")"
            hf_s=$T_S
        else
            run_timed "$label" 600 env "${CLEAN_ENV[@]}" "${envw[@]}" "$XFER_BIN" pull "$MIRROR_REPO" --json
            [ "$T_RC" = 0 ] || die "xfer pull from $server exited $T_RC: $(fail_tail "$label")"
            jq -e '.verification.all_verified == true' "$RUN/$label.out" >/dev/null ||
                die "xfer pull from $server is not all_verified: $(head -c 600 "$RUN/$label.out")"
            xfer_s=$T_S
        fi
        same_fp "mirror $server run $r $tool snapshot" "$RUN/fp-c-source.txt" "$(snapshot "$cache" "$MIRROR_REPO")" -L
    done
    rm -rf "$CACHES"/c-*
    local x
    x=$(ratio "$xfer_s" "$hf_s")
    awk -v a="$xfer_s" -v b="$hf_s" 'BEGIN { exit !(a <= b) }' || C_FAIL=1
    local cold=""
    [ "$r" != 1 ] || cold=" (cold)"
    C_ROWS+=("| $server | $r$cold | $(fmt %.2f "$hf_s") | $(fmt %.2f "$xfer_s") | $x |")
    log "mirror $server run $r$cold: hf $(fmt %.2f "$hf_s") s, xfer $(fmt %.2f "$xfer_s") s, xfer/hf $x"
}

C_DONE=0
part_mirror() {
    local src=$REPOS/$MIRROR_REPO r
    fingerprint "$src" >"$RUN/fp-c-source.txt"
    C_BYTES=$(tree_bytes "$src")
    log "part C: $MIRROR_REPO, $C_BYTES bytes, no rate cap"
    start_hub hub-c 0
    log "hub server at $HUB_URL (root namespace), no rate cap"
    for ((r = 1; r <= MIRROR_RUNS; r++)); do mirror_run hub_server.py "$r"; done
    stop_pid "$HUB_PID"
    if [ "$OLAH" = 1 ]; then
        local work=$PULL_DIR/olah out
        out=$("$SCRIPT_DIR/olah-mirror.sh" start "$work" "$MIRROR_PORT" "$MIRROR_REPO" "$src" 2>"$RUN/olah-start.err") ||
            die "olah-mirror.sh start failed: $(tail -n 3 "$RUN/olah-start.err" | tr '\n' ' ')"
        HUB_URL=$(awk '/^READY / { print $2; exit }' <<<"$out")
        HUB_HOST=""
        OLAH_WORK=$work
        log "olah mirror at $HUB_URL"
        for ((r = 1; r <= MIRROR_RUNS; r++)); do mirror_run olah "$r"; done
        "$SCRIPT_DIR/olah-mirror.sh" stop "$work" 2>/dev/null || true
        OLAH_WORK=""
    fi
    if [ "$C_FAIL" = 0 ]; then C_VERDICT=PASS; else C_VERDICT="BELOW FLOOR"; fi
    C_DONE=1
}

# -------------------------------------------------------------- report ----

REPORTED=0
report() {
    REPORTED=1
    local stamp
    stamp=$(date -u +%Y%m%dT%H%M%SZ)
    [ -s "$RESULTS" ] || echo "$CSV_HEADER" >"$RESULTS"
    {
        echo
        printf '### xfer pull benchmark (xfer %s, huggingface_hub %s, %d cores, %s)\n' "$XFER_REV" "${HF_VERSION:-n/a}" "$(nproc)" "$stamp"
        if [ "$A_DONE" = 1 ]; then
            echo
            printf 'Download of a %d MiB repo (%d files, %d shards) from tests/hub_server.py on loopback,\n' "$SIZE_MIB" "$A_FILES" "$SHARDS"
            printf 'capped at %s MB/s per connection; fresh cache and page cache dropped per run; median of %d run(s).\n' \
                "$(fmt %.0f "$(calc "$RATE / 1e6")")" "$RUNS"
            echo
            echo '| client | seconds | MB/s | peak RSS MiB | bodies at once | per-connection bound s |'
            echo '|---|---:|---:|---:|---:|---:|'
            printf '| hf download (%d workers) | %.2f | %s | %s | %s | %.2f |\n' "$HF_MAX_WORKERS" "$A_HF" "$(mb_s "$A_BYTES" "$A_HF")" \
                "$(mib "$(median "${A_HF_RSS[@]}")")" "$(maxof "${A_HF_CONC[@]}")" "$A_HF_BOUND"
            printf '| xfer pull (--connections %d) | %.2f | %s | %s | %s | %.2f |\n' "$CONNECTIONS" "$A_XFER" "$(mb_s "$A_BYTES" "$A_XFER")" \
                "$(mib "$(median "${A_XFER_RSS[@]}")")" "$(maxof "${A_XFER_CONC[@]}")" "$A_XFER_BOUND"
            echo
            printf 'hf download / xfer pull: **%sx** (floor %sx: %s; per run: %s)\n' "$A_RATIO" "$FLOOR" "$A_VERDICT" "${A_RATIOS[*]}"
            echo
            echo "Why: the server, like a CDN, caps each connection. hf download fetches each file whole over"
            echo "one connection (at most $HF_MAX_WORKERS files at once), so it needs at least largest file / cap"
            echo "($(fmt %.2f "$A_HF_BOUND") s here); xfer pull splits files into ranged parts over $CONNECTIONS connections"
            echo "(bound S / (min($CONNECTIONS, 16 MiB parts) x cap) = $(fmt %.2f "$A_XFER_BOUND") s)."
            echo "Both snapshots verified against the source (b3sum); ${A_LAYOUT:-}."
            printf '%s,%s,pull,%d,%d,%d,%d,%d,%.3f,%.3f,%s,,,,,,,,\n' "$stamp" "$XFER_REV" "$SIZE_MIB" "$SHARDS" "$RATE" "$CONNECTIONS" "$RUNS" \
                "$A_HF" "$A_XFER" "$A_RATIO" >>"$RESULTS"
        fi
        if [ "$C_DONE" = 1 ]; then
            echo
            printf 'A fast local mirror: a %d MiB repo (%d shards), no rate cap, fresh cache and page cache dropped per run;\n' "$MIRROR_SIZE_MIB" "$MIRROR_SHARDS"
            echo 'both clients at their defaults; run 1 right after the server started.'
            echo
            echo '| server | run | hf download s | xfer pull s | xfer / hf |'
            echo '|---|---|---:|---:|---:|'
            printf '%s\n' "${C_ROWS[@]}"
            echo
            echo "Floor: xfer / hf <= 1.00 in every run: $C_VERDICT."
        fi
        if [ "$B_DONE" = 1 ]; then
            local n
            for n in $FAN_NODES; do
                # shellcheck disable=SC2086
                local dm seqm filesm streamm ideal firstm
                dm=$(median ${B_D[$n]}) seqm=$(median ${B_SEQ[$n]}) filesm=$(median ${B_FILES[$n]}) streamm=$(median ${B_STREAM[$n]})
                firstm=$(maxof ${B_FIRST[$n]})
                ideal=$(maxof "$dm" "$B_F_IDEAL")
                local goal=1.10
                [ "$n" -le 2 ] || goal=1.15
                local verdict=PASS
                awk -v a="$streamm" -v b="$ideal" -v g="$goal" 'BEGIN { exit !(a <= g * b) }' || verdict="ABOVE GOAL"
                echo
                printf 'Delivery of a %d MiB repo to %d nodes, %d Mbit/s links (tc tbf, netns); server inside host 0 at\n' "$FAN_SIZE_MIB" "$n" "$LINK_MBIT"
                printf '%s MB/s per connection, xfer pull --connections %d (download bound %.2f s); median of %d run(s).\n' \
                    "$(fmt %.1f "$(calc "$FAN_RATE / 1e6")")" "$CONNECTIONS" "$B_D_BOUND" "$RUNS"
                echo
                echo '| | seconds | x ideal |'
                echo '|---|---:|---:|'
                printf '| D: xfer pull alone | %.2f | %s |\n' "$dm" "$(ratio "$dm" "$ideal")"
                printf '| F_ideal: S / link rate | %.2f | %s |\n' "$B_F_IDEAL" "$(ratio "$B_F_IDEAL" "$ideal")"
                printf '| ideal = max(D, F_ideal) | %.2f | 1.00 |\n' "$ideal"
                # shellcheck disable=SC2086
                printf '| sequential: pull, then push (%.2f + %.2f) | %.2f | %s |\n' "$(median ${B_SEQ_PULL[$n]})" "$(median ${B_SEQ_PUSH[$n]})" \
                    "$seqm" "$(ratio "$seqm" "$ideal")"
                printf '| file by file: pull --to --fan-out files | %.2f | %s |\n' "$filesm" "$(ratio "$filesm" "$ideal")"
                # shellcheck disable=SC2086
                printf '| streamed: pull --to (download %.2f) | %.2f | **%s** |\n' "$(median ${B_STREAM_DL[$n]})" "$streamm" "$(ratio "$streamm" "$ideal")"
                echo
                # shellcheck disable=SC2086
                printf 'Goal <= %s x ideal: %s (per run: %s). Slowest first_byte_s %.2f s (goal < 1 s). Source sent %.2f x S streaming.\n' \
                    "$goal" "$verdict" "$(for x in ${B_STREAM[$n]}; do printf '%s ' "$(ratio "$x" "$ideal")"; done)" "$firstm" "$(median ${B_SRCX[$n]})"
                echo "Every agent's folder equals host 0's (b3sum, diff -r --no-dereference); all three ways delivered one root."
                printf '%s,%s,fanout-%d,%d,%d,%d,%d,%d,,,,%d,%.3f,%.3f,%.3f,%.3f,%.3f,%s,%s\n' "$stamp" "$XFER_REV" "$n" "$FAN_SIZE_MIB" "$FAN_SHARDS" \
                    "$FAN_RATE" "$CONNECTIONS" "$RUNS" "$LINK_MBIT" "$dm" "$B_F_IDEAL" "$ideal" "$seqm" "$streamm" \
                    "$(ratio "$seqm" "$ideal")" "$(ratio "$streamm" "$ideal")" >>"$RESULTS"
            done
        fi
    } | tee -a "$PULL_DIR/summary.txt"
}

# ----------------------------------------------------------------- main ----

main() {
    preflight
    exec 9>"$PULL_DIR/.lock"
    flock -n 9 || die "another bench-pull run holds $PULL_DIR/.lock; wait for it to finish"
    find_xfer
    [ "$PART" = fanout ] || find_hf
    trap cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    rm -rf "$RUN" "$CACHES" "$PULL_DIR"/h[0-9]*
    mkdir -p "$RUN" "$CACHES" "$REPOS"
    local t_start=$EPOCHREALTIME
    cp "$XFER_BIN" "$RUN/xfer" # a rebuild elsewhere cannot swap the binary mid-run
    XFER_BIN=$RUN/xfer
    DROP_OK=1
    drop_caches
    [ "$DROP_OK" = 1 ] || log "warning: cannot write /proc/sys/vm/drop_caches; runs read the repo from the page cache"

    want() { [ "$PART" = all ] || [ "$PART" = "$1" ]; }
    if want pull; then gen_repo "$PULL_REPO" "$SIZE_MIB" "$SHARDS"; fi
    if want fanout; then gen_repo "$FAN_REPO" "$FAN_SIZE_MIB" "$FAN_SHARDS"; fi
    if want mirror; then gen_repo "$MIRROR_REPO" "$MIRROR_SIZE_MIB" "$MIRROR_SHARDS"; fi
    if want pull; then part_pull; fi
    if want mirror; then part_mirror; fi
    if want fanout; then part_fanout; fi
    report
    log "took $(fmt %.0f "$(calc "$EPOCHREALTIME - $t_start")") s; rows appended to $RESULTS, summary to $PULL_DIR/summary.txt"
    if [ "$A_DONE" = 1 ] && [ "$A_VERDICT" != PASS ]; then
        log "xfer pull is below the ${FLOOR}x floor against hf download"
        exit 3
    fi
    if [ "$C_DONE" = 1 ] && [ "$C_VERDICT" != PASS ]; then
        log "xfer pull was slower than hf download from a fast mirror in some run"
        exit 3
    fi
}

main
