#!/usr/bin/env bash
# Benchmarks for `xfer push`, side by side with the usual tools.
#
#   scripts/bench-push.sh [loopback|shaped|hash|chunks|connections|all|clean]   (default: all)
#
#   loopback  xfer push to one agent on 127.0.0.1 vs `rsync -a --whole-file` to
#             an rsync daemon on 127.0.0.1; median MB/s of RUNS alternating
#             runs, CPU seconds per GB delivered summed over every process
#             (xfer: pusher + agent; rsync: client + daemon and the children
#             it forks), peak RSS of both xfer ends,
#             and one extra push at half the size to show memory stays flat.
#   shaped    two network namespaces joined by a veth pair shaped to 1 Gbit/s
#             with tbf (see scripts/lib-netns.sh): iperf3 TCP as the reference,
#             then xfer goodput with cubic and bbr, at each MTU in SHAPED_MTUS.
#   hash      `xfer manifest` vs `b3sum --num-threads 2` over the same files.
#   chunks    loopback push and manifest hashing at each of CHUNK_SIZES.
#   connections  loopback push with --connections at each of CONNECTIONS
#             (interleaved, RUNS rounds): MB/s and CPU seconds per GB
#             delivered (pusher + agent). On 2 cores more connections cannot
#             go faster; the figure to watch is that CPU per GB does not grow.
#   clean     remove BENCH_DIR (the cached source trees) and exit.
#
# Environment (defaults in brackets):
#   SIZE_MB [2048]          model size for loopback, hash and chunks
#   RUNS [3]                runs per tool and figure (the median is reported)
#   SHAPED_SIZE_MB [2048]   model size over the shaped link (~17 s at 1 Gbit/s)
#   SHAPED_RUNS [1]         pushes per congestion controller and MTU
#   SHAPED_MTUS ["1500 9000"]  veth MTUs; the first is the headline figure
#   SHAPED_CCS ["cubic bbr"]   values of XFER_CONGESTION to try
#   IPERF_SECS [5]          iperf3 reference duration
#   CHUNK_SIZES ["1MiB 4MiB 16MiB"], CHUNK_RUNS [RUNS]
#   CONNECTIONS ["1 2 4"]   values of --connections for the connections part
#   HASH_THREADS [2]        b3sum --num-threads
#   TBF_RATE [1gbit] TBF_BURST [256kb] TBF_LATENCY [50ms]  (lib-netns.sh)
#   BENCH_DIR [/var/tmp/xfer-bench]  cached source trees and scratch space;
#                           must be a disk filesystem (not tmpfs)
#   PORT_BASE [17480]       xfer agent UDP port; rsyncd uses +1, iperf3 +2
#   PUSH_TIMEOUT [900]      seconds before a push counts as stalled
#   KEEP_RUN [0]            1 keeps the scratch directory (logs, JSON) on exit
#   XFER [unset]            run this xfer binary instead of building one
#
# The source tree stays in the page cache (warmed once with cat); the
# destination is emptied and `sync`ed before every run. Nothing drops caches.
# Every push runs with --rehash and a private XDG_CACHE_HOME, so xfer's hash
# cache never turns a benchmark run into a "hashing already done" re-run.
# Needs root (network namespaces, apt-get for missing tools).

set -euo pipefail
shopt -s inherit_errexit
export LC_ALL=C

usage() { sed -n '2,46p' "$0" | sed 's/^# \{0,1\}//'; }

PART=${1:-all}
case $PART in
loopback | shaped | hash | chunks | connections | all | clean) ;;
-h | --help | help)
    usage
    exit 0
    ;;
*)
    usage >&2
    exit 2
    ;;
esac

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPT_DIR/.." && pwd)
# shellcheck source=scripts/lib-netns.sh
source "$SCRIPT_DIR/lib-netns.sh"
# shellcheck source=scripts/lib-bench.sh
source "$SCRIPT_DIR/lib-bench.sh"

SIZE_MB=${SIZE_MB:-2048}
RUNS=${RUNS:-3}
SHAPED_SIZE_MB=${SHAPED_SIZE_MB:-2048}
SHAPED_RUNS=${SHAPED_RUNS:-1}
SHAPED_MTUS=${SHAPED_MTUS:-1500 9000}
SHAPED_CCS=${SHAPED_CCS:-cubic bbr}
IPERF_SECS=${IPERF_SECS:-5}
CHUNK_SIZES=${CHUNK_SIZES:-1MiB 4MiB 16MiB}
CHUNK_RUNS=${CHUNK_RUNS:-$RUNS}
CONNECTIONS=${CONNECTIONS:-1 2 4}
HASH_THREADS=${HASH_THREADS:-2}
BENCH_DIR=${BENCH_DIR:-/var/tmp/xfer-bench}
PORT_BASE=${PORT_BASE:-17480}
PUSH_TIMEOUT=${PUSH_TIMEOUT:-900}
KEEP_RUN=${KEEP_RUN:-0}
MODEL_NAME=bench-model
LINE_RATE=125000000 # bytes/s of a 1 Gbit/s link

XPORT=$PORT_BASE
RPORT=$((PORT_BASE + 1))
IPORT=$((PORT_BASE + 2))

PROBLEMS=()
note() {
    log "PROBLEM: $*"
    PROBLEMS+=("$*")
}

if [ "$PART" = clean ]; then
    rm -rf "$BENCH_DIR"
    log "removed $BENCH_DIR"
    exit 0
fi

[ "$(id -u)" = 0 ] || die "run as root (network namespaces, apt-get)"
for v in SIZE_MB RUNS SHAPED_SIZE_MB SHAPED_RUNS CHUNK_RUNS IPERF_SECS; do
    [[ ${!v} =~ ^[0-9]+$ && ${!v} -ge 1 ]] || die "$v must be a positive integer"
done
[ "$SIZE_MB" -ge 8 ] || die "SIZE_MB must be at least 8"

want() { [ "$PART" = all ] || [ "$PART" = "$1" ]; }

# ---------------------------------------------------------------- tools ----

need /usr/bin/time time
need jq jq
need pgrep procps
need timeout coreutils
need ss iproute2
need ip iproute2
if want loopback; then need rsync rsync; fi
if want shaped; then
    need tc iproute2
    need iperf3 iperf3
fi
if want hash; then need b3sum b3sum; fi

# ---------------------------------------------------------------- setup ----

mkdir -p "$BENCH_DIR"
fstype=$(stat -f -c %T "$BENCH_DIR")
[ "$fstype" != tmpfs ] || die "BENCH_DIR=$BENCH_DIR is on tmpfs; point it at a disk filesystem"

RUN=$BENCH_DIR/run
NETNS_CREATED=0

cleanup() {
    local rc=$?
    set +e
    trap - EXIT INT TERM
    stop_all
    if [ "$NETNS_CREATED" = 1 ]; then netns_down; fi
    if [ "$KEEP_RUN" = 1 ]; then
        log "scratch kept in $RUN"
    else
        rm -rf "$RUN"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if port_busy u "$XPORT"; then die "UDP port $XPORT is in use; set PORT_BASE"; fi
if port_busy t "$RPORT"; then die "TCP port $RPORT is in use; set PORT_BASE"; fi

rm -rf "$RUN"
mkdir -p "$RUN"

XFER_GIVEN=${XFER:-}
if [ -n "$XFER_GIVEN" ]; then
    [ -x "$XFER_GIVEN" ] || die "XFER=$XFER_GIVEN is not an executable"
    log "using XFER=$XFER_GIVEN (not building)"
    cp "$XFER_GIVEN" "$RUN/xfer"
else
    log "building xfer (release)"
    (cd "$REPO" && cargo build --release -p xfer >&2)
    TARGET_DIR=${CARGO_TARGET_DIR:-$REPO/target}
    # Run a private copy, so a rebuild elsewhere cannot swap the binary mid-run.
    cp "$TARGET_DIR/release/xfer" "$RUN/xfer"
fi
XFER=$RUN/xfer
KEY=$RUN/cluster.key
"$XFER" keygen --out "$KEY" >/dev/null
unset XFER_CONGESTION XFER_KEY RUST_LOG
# xfer keeps a hash cache of source trees in $XDG_CACHE_HOME/xfer. Keep ours
# private (and gone on exit), and pass --rehash so every push hashes the tree
# the way a first push of a new checkpoint does: hashing is part of the figure.
export XDG_CACHE_HOME=$RUN/cache
PUSH_EXTRA=()
if "$XFER" push --help 2>/dev/null | grep -q -- '--rehash'; then PUSH_EXTRA+=(--rehash); fi
if want connections && ! "$XFER" push --help 2>/dev/null | grep -q -- '--connections'; then
    die "this xfer has no push --connections; build a newer one (or drop the connections part)"
fi

CLK_TCK=$(getconf CLK_TCK)
GIT_REV=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ -n "$(git -C "$REPO" status --porcelain -- xfer/src 2>/dev/null)" ]; then
    GIT_REV="$GIT_REV+dirty"
fi
if [ -n "$XFER_GIVEN" ]; then GIT_REV="XFER=$XFER_GIVEN"; fi

# ---------------------------------------------------------------- helpers ----

# start_agent NETNS LISTEN ROOT CC: starts `xfer serve` (inside NETNS unless
# empty) and waits for its "listening" line. Sets AGENT_PID.
AGENT_PID=
start_agent() {
    local ns=$1 listen=$2 root=$3 cc=$4
    local out=$RUN/agent.out err=$RUN/agent.err
    : >"$out"
    : >"$err"
    if [ -n "$ns" ]; then
        XFER_CONGESTION=$cc ip netns exec "$ns" "$XFER" serve --listen "$listen" --root "$root" --key "$KEY" >"$out" 2>"$err" &
    else
        XFER_CONGESTION=$cc "$XFER" serve --listen "$listen" --root "$root" --key "$KEY" >"$out" 2>"$err" &
    fi
    AGENT_PID=$!
    track "$AGENT_PID"
    local i
    for ((i = 0; i < 150; i++)); do
        if grep -q 'xfer agent listening' "$out"; then return 0; fi
        kill -0 "$AGENT_PID" 2>/dev/null || die "agent exited at start: $(tail -n5 "$err")"
        sleep 0.1
    done
    die "agent did not report listening within 15 s"
}
stop_agent() {
    stop_pid "$AGENT_PID"
    {
        echo "--- agent $1"
        cat "$RUN/agent.err"
    } >>"$RUN/agents.log"
    if grep -Eq ' (WARN|ERROR) ' "$RUN/agent.err"; then
        note "agent logged during $1: $(grep -E ' (WARN|ERROR) ' "$RUN/agent.err" | head -n3 | tr '\n' ' ')"
    fi
}

# xfer_push_once LABEL NETNS-PUSHER NETNS-AGENT AGENT-IP SRC CHUNK CC DST
# One push into a fresh agent and an empty destination. Sets X_* variables.
xfer_push_once() {
    local label=$1 ns_p=$2 ns_a=$3 ip=$4 src=$5 chunk=$6 cc=$7 dst=$8
    fresh_dir "$dst"
    start_agent "$ns_a" "$ip:$XPORT" "$dst" "$cc"
    local a0 a1 t0 t1 rc=0
    a0=$(proc_ticks "$AGENT_PID")
    local cmd=(/usr/bin/time -f '%e %U %S %M' -o "$RUN/time.out"
        timeout -s INT "$PUSH_TIMEOUT" "$XFER" push "$src" --to "$ip:$XPORT" --key "$KEY" --json --chunk-size "$chunk" "${PUSH_EXTRA[@]}")
    if [ -n "$ns_p" ]; then cmd=(ip netns exec "$ns_p" "${cmd[@]}"); fi
    t0=$EPOCHREALTIME
    XFER_CONGESTION=$cc "${cmd[@]}" >"$RUN/push.json" 2>"$RUN/push.err" || rc=$?
    t1=$EPOCHREALTIME
    X_SYNC=$(timed_sync)
    a1=$(proc_ticks "$AGENT_PID")
    X_RSS_AGENT=$(awk '/^VmHWM:/ { print $2 }' "/proc/$AGENT_PID/status")
    stop_agent "$label"
    X_WALL=$(elapsed "$t0" "$t1")
    if [ "$rc" != 0 ]; then
        if [ "$rc" = 124 ] || grep -q 'Command terminated by signal' "$RUN/time.out"; then
            note "$label: xfer push stalled (no result after ${PUSH_TIMEOUT}s)"
        fi
        note "$label: xfer push exited $rc: $(tail -n3 "$RUN/push.err" | tr '\n' ' ')"
        return 1
    fi
    local t
    t=$(tail -n1 "$RUN/time.out")
    read -r _ X_USER X_SYS X_RSS_PUSH <<<"$t"
    read -r X_BYTES X_SENT X_HASH X_DUR X_OK < <(jq -r '[.bytes_total, .bytes_sent, .hash_s, .duration_s, ([.nodes[].ok] | all)] | @tsv' "$RUN/push.json")
    X_XFER_S=$(calc "$X_DUR - $X_HASH")
    X_CPU_AGENT=$(calc "($a1 - $a0) / $CLK_TCK")
    X_CPU=$(calc "$X_USER + $X_SYS + $X_CPU_AGENT")
    if [ "$X_OK" != true ] || [ "$X_SENT" != "$X_BYTES" ]; then
        note "$label: push reported ok=$X_OK, sent $X_SENT of $X_BYTES bytes"
        return 1
    fi
    local got
    got=$(tree_bytes "$dst/$MODEL_NAME")
    if [ "$got" != "$X_BYTES" ]; then
        note "$label: destination holds $got bytes, expected $X_BYTES"
        return 1
    fi
    log "$(printf '%-22s wall %6.2fs  %7.1f MB/s  transfer-only %7.1f MB/s (hash %.2fs)  cpu %.2fs (agent %.2fs)  rss push %d MiB agent %d MiB  sync %.2fs' \
        "$label" "$X_WALL" "$(calc "$X_BYTES / $X_WALL / 1e6")" "$(calc "$X_BYTES / $X_XFER_S / 1e6")" "$X_HASH" "$X_CPU" "$X_CPU_AGENT" \
        $((X_RSS_PUSH / 1024)) $((X_RSS_AGENT / 1024)) "$X_SYNC")"
}

# rsync_once LABEL SRC DST: one `rsync -a --whole-file` into a fresh daemon and
# an empty destination. Sets R_* variables.
rsync_once() {
    local label=$1 src=$2 dst=$3
    fresh_dir "$dst"
    rm -f "$RUN/rsyncd.pid"
    cat >"$RUN/rsyncd.conf" <<EOF
pid file = $RUN/rsyncd.pid
log file = $RUN/rsyncd.log
address = 127.0.0.1
port = $RPORT
use chroot = no
uid = root
gid = root
[bench]
    path = $dst
    read only = false
EOF
    rsync --daemon --no-detach --config="$RUN/rsyncd.conf" >"$RUN/rsyncd.out" 2>&1 &
    local dpid=$! i
    track "$dpid"
    for ((i = 0; i < 100; i++)); do
        if port_busy t "$RPORT"; then break; fi
        kill -0 "$dpid" 2>/dev/null || die "rsync daemon exited: $(cat "$RUN/rsyncd.out")"
        sleep 0.1
    done
    port_busy t "$RPORT" || die "rsync daemon did not listen on $RPORT"
    local d0 d1 t0 t1 rc=0
    d0=$(proc_ticks "$dpid" 1)
    t0=$EPOCHREALTIME
    /usr/bin/time -f '%e %U %S %M' -o "$RUN/time.out" \
        timeout -s INT "$PUSH_TIMEOUT" rsync -a --whole-file "$src/" "rsync://127.0.0.1:$RPORT/bench/$MODEL_NAME/" \
        >"$RUN/rsync.out" 2>&1 || rc=$?
    t1=$EPOCHREALTIME
    R_SYNC=$(timed_sync)
    # The daemon forks one child per connection (which forks again); wait
    # until it has reaped them so their CPU shows in cutime/cstime.
    for ((i = 0; i < 200; i++)); do
        if ! pgrep -P "$dpid" >/dev/null; then break; fi
        sleep 0.05
    done
    d1=$(proc_ticks "$dpid" 1)
    stop_pid "$dpid"
    R_WALL=$(elapsed "$t0" "$t1")
    if [ "$rc" != 0 ]; then
        note "$label: rsync exited $rc: $(tail -n3 "$RUN/rsync.out" | tr '\n' ' ')"
        return 1
    fi
    read -r _ R_USER R_SYS R_RSS <<<"$(tail -n1 "$RUN/time.out")"
    R_CPU_DAEMON=$(calc "($d1 - $d0) / $CLK_TCK")
    R_CPU=$(calc "$R_USER + $R_SYS + $R_CPU_DAEMON")
    R_BYTES=$(tree_bytes "$dst/$MODEL_NAME")
    log "$(printf '%-22s wall %6.2fs  %7.1f MB/s  cpu %.2fs (daemon %.2fs)  rss client %d MiB  sync %.2fs' \
        "$label" "$R_WALL" "$(calc "$R_BYTES / $R_WALL / 1e6")" "$R_CPU" "$R_CPU_DAEMON" $((R_RSS / 1024)) "$R_SYNC")"
}

# manifest_once SRC CHUNK: wall seconds of `xfer manifest` (output to /dev/null).
manifest_once() {
    local t0=$EPOCHREALTIME
    "$XFER" manifest "$1" --chunk-size "$2" >"$RUN/manifest.out" 2>"$RUN/manifest.err" ||
        die "xfer manifest failed: $(tail -n3 "$RUN/manifest.err")"
    elapsed "$t0" "$EPOCHREALTIME"
}

declare -A R=()

log "xfer $GIT_REV, $(nproc) cores, kernel $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg), BENCH_DIR $BENCH_DIR ($fstype)"

# ---------------------------------------------------------------- (a) ----

if want loopback; then
    SRC=$(gen_tree "$SIZE_MB")
    HALF_MB=$((SIZE_MB / 2))
    SRC_HALF=$(gen_tree "$HALF_MB")
    warm "$SRC"
    BYTES=$(tree_bytes "$SRC")
    log "loopback: $BYTES bytes, $RUNS runs each, alternating xfer / rsync"
    xm=() xo=() xd=() xc=() xcp=() xca=() xrp=() xra=() rm_=() rd=() rc_=() rcc=() rcd=() rr=()
    for ((run = 1; run <= RUNS; run++)); do
        if xfer_push_once "xfer loopback #$run" "" "" 127.0.0.1 "$SRC" 4MiB cubic "$RUN/dst-xfer"; then
            xm+=("$(calc "$X_BYTES / $X_WALL / 1e6")")
            xo+=("$(calc "$X_BYTES / $X_XFER_S / 1e6")")
            xd+=("$(calc "$X_BYTES / ($X_WALL + $X_SYNC) / 1e6")")
            xc+=("$(calc "$X_CPU / ($X_BYTES / 1e9)")")
            xcp+=("$(calc "($X_USER + $X_SYS) / ($X_BYTES / 1e9)")")
            xca+=("$(calc "$X_CPU_AGENT / ($X_BYTES / 1e9)")")
            xrp+=("$X_RSS_PUSH")
            xra+=("$X_RSS_AGENT")
        fi
        rm -rf "$RUN/dst-xfer"
        if rsync_once "rsync loopback #$run" "$SRC" "$RUN/dst-rsync"; then
            if [ "$R_BYTES" != "$BYTES" ]; then note "rsync copied $R_BYTES of $BYTES bytes"; fi
            rm_+=("$(calc "$BYTES / $R_WALL / 1e6")")
            rd+=("$(calc "$BYTES / ($R_WALL + $R_SYNC) / 1e6")")
            rc_+=("$(calc "$R_CPU / ($BYTES / 1e9)")")
            rcc+=("$(calc "($R_USER + $R_SYS) / ($BYTES / 1e9)")")
            rcd+=("$(calc "$R_CPU_DAEMON / ($BYTES / 1e9)")")
            rr+=("$R_RSS")
        fi
        rm -rf "$RUN/dst-rsync"
    done
    R[lo_x_mbs]=$(median "${xm[@]}")
    R[lo_x_only]=$(median "${xo[@]}")
    R[lo_x_dur]=$(median "${xd[@]}")
    R[lo_x_cpu]=$(median "${xc[@]}")
    R[lo_x_cpu_p]=$(median "${xcp[@]}")
    R[lo_x_cpu_a]=$(median "${xca[@]}")
    R[lo_x_rss_p]=$(maxof "${xrp[@]}")
    R[lo_x_rss_a]=$(maxof "${xra[@]}")
    R[lo_r_mbs]=$(median "${rm_[@]}")
    R[lo_r_dur]=$(median "${rd[@]}")
    R[lo_r_cpu]=$(median "${rc_[@]}")
    R[lo_r_cpu_c]=$(median "${rcc[@]}")
    R[lo_r_cpu_d]=$(median "${rcd[@]}")
    R[lo_r_rss]=$(maxof "${rr[@]}")

    warm "$SRC_HALF"
    if xfer_push_once "xfer loopback half" "" "" 127.0.0.1 "$SRC_HALF" 4MiB cubic "$RUN/dst-xfer"; then
        R[half_rss_p]=$X_RSS_PUSH
        R[half_rss_a]=$X_RSS_AGENT
    fi
    rm -rf "$RUN/dst-xfer"
    R[half_mb]=$HALF_MB
fi

# ---------------------------------------------------------------- (b) ----

if want shaped; then
    SSRC=$(gen_tree "$SHAPED_SIZE_MB")
    warm "$SSRC"
    for mtu in $SHAPED_MTUS; do
        NETNS_CREATED=1
        netns_up "$mtu"
        log "shaped: $NS_A/$VETH_A $IP_A <-> $NS_B/$VETH_B $IP_B, mtu $mtu, tbf rate $TBF_RATE burst $TBF_BURST latency $TBF_LATENCY"
        ip netns exec "$NS_B" iperf3 -s -1 -B "$IP_B" -p "$IPORT" >"$RUN/iperf-server.out" 2>&1 &
        ipid=$!
        track "$ipid"
        for ((i = 0; i < 100; i++)); do
            if [ -n "$(ip netns exec "$NS_B" ss -Hltn "sport = :$IPORT")" ]; then break; fi
            sleep 0.05
        done
        if ip netns exec "$NS_A" iperf3 -c "$IP_B" -p "$IPORT" -t "$IPERF_SECS" -J >"$RUN/iperf.json" 2>&1; then
            R[ip_$mtu]=$(jq -r '.end.sum_received.bits_per_second / 8' "$RUN/iperf.json")
            log "$(printf 'iperf3 TCP mtu %-5s %7.1f MB/s (%.3f of line rate), %s retransmits' "$mtu" \
                "$(calc "${R[ip_$mtu]} / 1e6")" "$(calc "${R[ip_$mtu]} / $LINE_RATE")" "$(jq -r '.end.sum_sent.retransmits' "$RUN/iperf.json")")"
        else
            note "iperf3 failed at mtu $mtu: $(head -c 300 "$RUN/iperf.json")"
            R[ip_$mtu]=n/a
        fi
        stop_pid "$ipid"
        for cc in $SHAPED_CCS; do
            gp=() walls=()
            for ((run = 1; run <= SHAPED_RUNS; run++)); do
                read -r _ s0 p0 d0 _ < <(netns_qdisc_stats | head -n1 | awk '{ print $1, $3, $5, $8 }')
                if xfer_push_once "xfer $cc mtu $mtu #$run" "$NS_A" "$NS_B" "$IP_B" "$SSRC" 4MiB "$cc" "$RUN/dst-shaped"; then
                    gp+=("$(calc "$X_BYTES / $X_XFER_S")")
                    walls+=("$(calc "$X_BYTES / $X_WALL / 1e6")")
                fi
                read -r _ s1 p1 d1 _ < <(netns_qdisc_stats | head -n1 | awk '{ print $1, $3, $5, $8 }')
                R[drops_${cc}_$mtu]=$((d1 - d0))
                R[pkt_${cc}_$mtu]=$(calc "($s1 - $s0) / ($p1 - $p0)")
                log "  tbf $NS_A/$VETH_A: $((p1 - p0)) packets, avg $(fmt '%.0f' "${R[pkt_${cc}_$mtu]}") B, $((d1 - d0)) dropped"
                rm -rf "$RUN/dst-shaped"
            done
            R[gp_${cc}_$mtu]=$(median "${gp[@]}")
            R[gpw_${cc}_$mtu]=$(median "${walls[@]}")
        done
        netns_down
        NETNS_CREATED=0
    done
fi

# ---------------------------------------------------------------- (c) ----

if want hash; then
    SRC=$(gen_tree "$SIZE_MB")
    warm "$SRC"
    BYTES=$(tree_bytes "$SRC")
    mapfile -t FILES < <(find "$SRC" -type f | sort)
    log "hash: ${#FILES[@]} files, $BYTES bytes, $RUNS runs each"
    hx=() hb=()
    for ((run = 1; run <= RUNS; run++)); do
        s=$(manifest_once "$SRC" 4MiB)
        hx+=("$(calc "$BYTES / $s / 1e9")")
        t0=$EPOCHREALTIME
        b3sum --num-threads "$HASH_THREADS" "${FILES[@]}" >"$RUN/b3sum.out"
        b=$(elapsed "$t0" "$EPOCHREALTIME")
        hb+=("$(calc "$BYTES / $b / 1e9")")
        log "$(printf 'hash #%d  xfer manifest %.2fs %.2f GB/s   b3sum %.2fs %.2f GB/s' "$run" "$s" "${hx[-1]}" "$b" "${hb[-1]}")"
    done
    # Same digests for the same files?
    if ! diff <(awk 'length($1) == 64 && $1 ~ /^[0-9a-f]+$/ { print $1 }' "$RUN/manifest.out" | sort) \
        <(awk '{ print $1 }' "$RUN/b3sum.out" | sort) >/dev/null; then
        note "xfer manifest and b3sum disagree on the file digests"
    fi
    R[h_x]=$(median "${hx[@]}")
    R[h_b]=$(median "${hb[@]}")
fi

# ---------------------------------------------------------------- (d) ----

if want chunks; then
    SRC=$(gen_tree "$SIZE_MB")
    warm "$SRC"
    BYTES=$(tree_bytes "$SRC")
    log "chunks: $CHUNK_SIZES, $CHUNK_RUNS rounds, sizes interleaved within each round"
    declare -A CM=() CO=() CH=() CRP=() CRA=()
    # Round-robin over the sizes, so a burst of load from elsewhere on the
    # machine hits every size alike instead of one size's whole series.
    for ((run = 1; run <= CHUNK_RUNS; run++)); do
        for cs in $CHUNK_SIZES; do
            if xfer_push_once "xfer chunk $cs #$run" "" "" 127.0.0.1 "$SRC" "$cs" cubic "$RUN/dst-xfer"; then
                CM[$cs]+=" $(calc "$X_BYTES / $X_WALL / 1e6")"
                CO[$cs]+=" $(calc "$X_BYTES / $X_XFER_S / 1e6")"
                CRP[$cs]+=" $X_RSS_PUSH"
                CRA[$cs]+=" $X_RSS_AGENT"
            fi
            rm -rf "$RUN/dst-xfer"
            s=$(manifest_once "$SRC" "$cs")
            CH[$cs]+=" $(calc "$BYTES / $s / 1e9")"
            log "$(printf 'xfer manifest chunk %-6s %.2fs %.2f GB/s' "$cs" "$s" "$(calc "$BYTES / $s / 1e9")")"
        done
    done
    for cs in $CHUNK_SIZES; do
        # shellcheck disable=SC2086 # the lists are space separated on purpose
        {
            R[c_mbs_$cs]=$(median ${CM[$cs]:-})
            R[c_only_$cs]=$(median ${CO[$cs]:-})
            R[c_hash_$cs]=$(median ${CH[$cs]:-})
            R[c_rssp_$cs]=$(maxof ${CRP[$cs]:-})
            R[c_rssa_$cs]=$(maxof ${CRA[$cs]:-})
        }
    done
fi

# ---------------------------------------------------------------- (e) ----

if want connections; then
    SRC=$(gen_tree "$SIZE_MB")
    warm "$SRC"
    log "connections: --connections $CONNECTIONS, $RUNS rounds, interleaved within each round"
    declare -A KM=() KC=()
    base_extra=("${PUSH_EXTRA[@]}")
    for ((run = 1; run <= RUNS; run++)); do
        for k in $CONNECTIONS; do
            PUSH_EXTRA=("${base_extra[@]}" --connections "$k")
            if xfer_push_once "xfer connections $k #$run" "" "" 127.0.0.1 "$SRC" 4MiB cubic "$RUN/dst-xfer"; then
                used=$(jq -r '[.nodes[0].bytes_per_connection[]? | select(. > 0)] | length' "$RUN/push.json")
                [ "$used" = "$k" ] || note "connections $k #$run: bytes went over $used connections"
                KM[$k]+=" $(calc "$X_BYTES / $X_XFER_S / 1e6")"
                KC[$k]+=" $(calc "$X_CPU / ($X_BYTES / 1e9)")"
            fi
            rm -rf "$RUN/dst-xfer"
        done
    done
    PUSH_EXTRA=("${base_extra[@]}")
    for k in $CONNECTIONS; do
        # shellcheck disable=SC2086 # the lists are space separated on purpose
        {
            R[k_mbs_$k]=$(median ${KM[$k]:-})
            R[k_cpu_$k]=$(median ${KC[$k]:-})
        }
    done
fi

# ---------------------------------------------------------------- report ----

mib() { if [[ $1 == n/a || -z $1 ]]; then echo n/a; else echo $((($1 + 512) / 1024)); fi; }
ROWS=()
row() { ROWS+=("$1"$'\t'"$2"$'\t'"$3"$'\t'"$4"$'\t'"$5"); }
MD=()
md() { MD+=("| $1 | $2 | $3 | $4 |"); }

if want loopback; then
    row loopback "MB/s, whole command (hashing incl.), median" "$(fmt %.0f "${R[lo_x_mbs]}")" "rsync $(fmt %.0f "${R[lo_r_mbs]}")" "$(ratio "${R[lo_x_mbs]}" "${R[lo_r_mbs]}")"
    row loopback "MB/s, transfer only (duration_s - hash_s)" "$(fmt %.0f "${R[lo_x_only]}")" "-" "-"
    row loopback "MB/s, including a trailing sync" "$(fmt %.0f "${R[lo_x_dur]}")" "rsync $(fmt %.0f "${R[lo_r_dur]}")" "$(ratio "${R[lo_x_dur]}" "${R[lo_r_dur]}")"
    row loopback "CPU s per GB delivered, all processes, median" "$(fmt %.2f "${R[lo_x_cpu]}")" "rsync $(fmt %.2f "${R[lo_r_cpu]}")" "$(ratio "${R[lo_x_cpu]}" "${R[lo_r_cpu]}")"
    row loopback "  of which pusher / agent (rsync: client / daemon)" "$(fmt %.2f "${R[lo_x_cpu_p]}") / $(fmt %.2f "${R[lo_x_cpu_a]}")" "rsync $(fmt %.2f "${R[lo_r_cpu_c]}") / $(fmt %.2f "${R[lo_r_cpu_d]}")" "-"
    row memory "peak RSS MiB pusher, $HALF_MB vs $SIZE_MB MiB" "$(mib "${R[half_rss_p]:-n/a}") / $(mib "${R[lo_x_rss_p]}")" "rsync client $(mib "${R[lo_r_rss]}")" "-"
    row memory "peak RSS MiB agent, $HALF_MB vs $SIZE_MB MiB" "$(mib "${R[half_rss_a]:-n/a}") / $(mib "${R[lo_x_rss_a]}")" "-" "-"
    md "Loopback push, $SIZE_MB MiB, MB/s (whole command, hashing incl.)" "$(fmt %.0f "${R[lo_x_mbs]}")" "rsync $(fmt %.0f "${R[lo_r_mbs]}")" "$(ratio "${R[lo_x_mbs]}" "${R[lo_r_mbs]}")"
    md "Loopback push, transfer only, MB/s" "$(fmt %.0f "${R[lo_x_only]}")" "" ""
    md "Loopback CPU s per GB delivered, all processes (pusher + agent; rsync client + daemon)" "$(fmt %.2f "${R[lo_x_cpu]}") ($(fmt %.2f "${R[lo_x_cpu_p]}") + $(fmt %.2f "${R[lo_x_cpu_a]}"))" "rsync $(fmt %.2f "${R[lo_r_cpu]}") ($(fmt %.2f "${R[lo_r_cpu_c]}") + $(fmt %.2f "${R[lo_r_cpu_d]}"))" "$(ratio "${R[lo_x_cpu]}" "${R[lo_r_cpu]}")"
    md "Peak RSS pusher / agent, $HALF_MB → $SIZE_MB MiB" "$(mib "${R[half_rss_p]:-n/a}")/$(mib "${R[half_rss_a]:-n/a}") → $(mib "${R[lo_x_rss_p]}")/$(mib "${R[lo_x_rss_a]}") MiB" "" ""
fi
if want shaped; then
    for mtu in $SHAPED_MTUS; do
        ipf=${R[ip_$mtu]}
        row shaped "iperf3 TCP goodput MB/s, MTU $mtu" "-" "iperf3 $(fmt %.1f "$(calc "$ipf / 1e6" 2>/dev/null || echo n/a)") ($(fmt %.0f "$(calc "100 * $ipf / $LINE_RATE" 2>/dev/null || echo n/a)")% of line)" "-"
        for cc in $SHAPED_CCS; do
            g=${R[gp_${cc}_$mtu]}
            if [[ $g == n/a ]]; then gm=n/a gpct=n/a; else
                gm=$(calc "$g / 1e6")
                gpct=$(calc "100 * $g / $LINE_RATE")
            fi
            row shaped "xfer $cc goodput MB/s, MTU $mtu (drops ${R[drops_${cc}_$mtu]:-?})" "$(fmt %.1f "$gm") ($(fmt %.0f "$gpct")% of line)" "iperf3 $(fmt %.1f "$(calc "$ipf / 1e6" 2>/dev/null || echo n/a)")" "$(ratio "$g" "$ipf")"
            md "1 Gbit/s tbf link, MTU $mtu, $cc: goodput MB/s (% of line)" "$(fmt %.1f "$gm") ($(fmt %.0f "$gpct")%)" "iperf3 $(fmt %.1f "$(calc "$ipf / 1e6" 2>/dev/null || echo n/a)")" "$(ratio "$g" "$ipf")"
        done
    done
fi
if want hash; then
    hr=$(ratio "${R[h_x]}" "${R[h_b]}")
    verdict=$(awk -v r="$hr" 'BEGIN { if (r == "n/a") print "?"; else if (r + 0 >= 0.8) print "ok"; else print "BELOW 0.8" }')
    row hash "GB/s, xfer manifest vs b3sum --num-threads $HASH_THREADS" "$(fmt %.2f "${R[h_x]}")" "b3sum $(fmt %.2f "${R[h_b]}")" "$hr $verdict"
    md "Hashing GB/s, warm cache ($HASH_THREADS threads)" "$(fmt %.2f "${R[h_x]}")" "b3sum $(fmt %.2f "${R[h_b]}")" "$hr"
fi
if want chunks; then
    cpush="" chash="" crss=""
    for cs in $CHUNK_SIZES; do
        row chunks "chunk $cs: push MB/s (transfer only) / hash GB/s" "$(fmt %.0f "${R[c_mbs_$cs]}") ($(fmt %.0f "${R[c_only_$cs]}")) / $(fmt %.2f "${R[c_hash_$cs]}")" "-" "$(ratio "${R[c_mbs_$cs]}" "${R[c_mbs_4MiB]:-n/a}") vs 4MiB"
        row chunks "chunk $cs: peak RSS MiB pusher / agent" "$(mib "${R[c_rssp_$cs]}") / $(mib "${R[c_rssa_$cs]}")" "-" "-"
        cpush+="${cpush:+ / }$(fmt %.0f "${R[c_mbs_$cs]}")"
        chash+="${chash:+ / }$(fmt %.2f "${R[c_hash_$cs]}")"
        crss+="${crss:+, }$(mib "${R[c_rssp_$cs]}")/$(mib "${R[c_rssa_$cs]}")"
    done
    md "Chunk ${CHUNK_SIZES// / \/ }: loopback push MB/s" "$cpush" "" ""
    md "Chunk ${CHUNK_SIZES// / \/ }: hashing GB/s" "$chash" "" ""
    md "Chunk ${CHUNK_SIZES// / \/ }: peak RSS pusher/agent MiB" "$crss" "" ""
fi

if want connections; then
    first=${CONNECTIONS%% *}
    kmbs="" kcpu=""
    for k in $CONNECTIONS; do
        row connections "--connections $k: MB/s transfer only / CPU s per GB (pusher + agent)" "$(fmt %.0f "${R[k_mbs_$k]}") / $(fmt %.2f "${R[k_cpu_$k]}")" "-" "$(ratio "${R[k_cpu_$k]}" "${R[k_cpu_$first]}") CPU vs $first"
        kmbs+="${kmbs:+ / }$(fmt %.0f "${R[k_mbs_$k]}")"
        kcpu+="${kcpu:+ / }$(fmt %.2f "${R[k_cpu_$k]}")"
    done
    md "Loopback, --connections ${CONNECTIONS// / \/ }: MB/s (transfer only)" "$kmbs" "" ""
    md "Loopback, --connections ${CONNECTIONS// / \/ }: CPU s per GB (pusher + agent)" "$kcpu" "" ""
fi

{
    echo
    echo "== xfer push benchmarks: xfer $GIT_REV, $(nproc) cores, SIZE_MB=$SIZE_MB RUNS=$RUNS SHAPED_SIZE_MB=$SHAPED_SIZE_MB, $(date -u +%Y-%m-%dT%H:%MZ) =="
    {
        printf 'part\tmeasurement\txfer\treference\txfer/ref\n'
        printf '%s\n' "${ROWS[@]}"
    } | column -t -s $'\t'
    if want shaped; then
        echo "shaped link: veth $VETH_A ($NS_A, $IP_A/$NET_PREFIX) <-> $VETH_B ($NS_B, $IP_B/$NET_PREFIX), each end: tc qdisc tbf rate $TBF_RATE burst $TBF_BURST latency $TBF_LATENCY; goodput = bytes_total / (duration_s - hash_s), line = 125e6 B/s"
    fi
    echo
    echo "| Benchmark ($(nproc) cores) | xfer | reference | xfer/ref |"
    echo "|---|---:|---|---:|"
    printf '%s\n' "${MD[@]}"
    if [ ${#PROBLEMS[@]} -gt 0 ]; then
        echo
        echo "Problems seen:"
        printf -- '- %s\n' "${PROBLEMS[@]}"
    fi
} | tee "$BENCH_DIR/summary-$(date -u +%Y%m%dT%H%M%SZ).txt"
