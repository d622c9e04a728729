#!/usr/bin/env bash
# Scale bench: one source delivers a model to N receivers, for several N, on
# real processes over shaped links (scripts/netcluster.sh), one table row per N.
#
#   scripts/bench-scale.sh [NS [RATE_MBIT [SIZE_MIB]]]
#       NS "8 16 24" (receiver counts, one run each), RATE_MBIT 100, SIZE_MIB 128;
#       each may also be given as an env variable of that name
#
# Per N: a fresh cluster of hosts 0..N, every link tbf-shaped to RATE both
# ways at MTU 1500; `xfer serve` on hosts 1..N; host 0 runs `xfer push
# --json --rehash` (private XDG_CACHE_HOME) to all of them; every copy is
# compared with the source by b3sum (the run fails otherwise).
# The baseline is the physical bound S/B (S = tree bytes, B = RATE*1e6/8
# bytes/s: every node must download S through its own link); times are
# printed as multiples of it. Columns:
#   S/B s       the bound, seconds
#   p50 p90 max each node's duration_s from the push's JSON (nodes[]): from
#               the start of that node's delivery, after hashing, until it
#               held the model verified; percentiles by nearest rank, x S/B
#   wall        the whole push command, hashing included (--rehash), x S/B
#   src_x       source_sent_x (JSON): chunk bytes the source sent / S (whole
#               chunks handed to a stream, also those a node then got elsewhere)
#   src_ok      the nodes' from_source summed (JSON) / S: verified bytes
#               that came from the source; src_x above it is upload spent on
#               chunks the nodes did not take from it
#   src_tc      host 0's uplink bytes counted by tc / S (QUIC, UDP, IP
#               and Ethernet headers, and ACKs: 1.06 when src_x is 1.00 at MTU 1500)
#   wire        every host's uplink bytes (tc) / (N x S): bytes on the wire
#               against bytes delivered; above ~1.06 means duplicate chunks
#               or control traffic
#   links       the largest max_peer_links any node reported
#   cpu/GB      CPU seconds of every xfer process (the pusher from
#               /usr/bin/time, each agent's utime+stime from /proc/PID/stat
#               over the push) per GB delivered (N x S, 1 GB = 1e9 bytes)
#   kern%       the kernel's (stime) share of that CPU time
#   xfer%       that CPU time as a share of the machine's over the push
#               (wall x cores); the kernel's forwarding of the packets through
#               veths, the bridge and tbf is mostly not in it
#   idle%       the machine's CPU idle over the push (/proc/stat deltas, idle +
#               iowait over all). Below 20 % the CPU, not the links, bounds the
#               run: the script warns; lower RATE_MBIT then. Other work on the
#               machine lowers it too: compare with xfer%
# Churn (issue 33): CHURN=K kill -9s the agents of hosts 2..K+1 once the
# source's uplink has carried a third of S, and JOIN=1 starts host N's agent
# only once it has carried half of S (the push names it from the start: it
# is offered the model again every second while the others receive, and
# joins the running swarm). The push then exits non-zero for the dead only;
# p50/p90/max are over the nodes that completed, and the row adds the
# joiner's bytes from its peers over what it received (peer%). Every
# completed copy is still compared by b3sum.
#   CHURN=3 JOIN=1 RATE_MBIT=33 scripts/bench-scale.sh 24
#
# Rows are appended to $SCALE_DIR/results.csv and the table to
# $SCALE_DIR/summary.txt.
#
# Runtime: per N about the push (~1.2-1.5 x S/B once peer-to-peer) + ~10 s of
# setup and ~N x 0.3 s of checks; the defaults (S/B = 10.7 s) take ~3 min.
#
# Env: XFER [$CARGO_TARGET_DIR or target/release/xfer], SCALE_DIR
# [/var/tmp/xfer-scale] (source tree cache, host roots h<i>/, run/,
# results.csv; disk, not tmpfs), PREFIX [xsc] (namespace names, see
# netcluster.sh), PORT [17530] (xfer UDP), PUSH_TIMEOUT [4*N*S/B + 120 s],
# KEEP_RUN [0] keeps logs and JSON (run/n<N>/), PUSH_ARGS [none] (more
# arguments of the push). Needs root (network namespaces; apt-get for
# missing tools).

set -euo pipefail
shopt -s inherit_errexit
export LC_ALL=C

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPT_DIR/.." && pwd)
SELF=$SCRIPT_DIR/$(basename "${BASH_SOURCE[0]}")
LOG_TAG=scale
# shellcheck source=scripts/lib-bench.sh
source "$SCRIPT_DIR/lib-bench.sh"

usage() { sed -n '2,/^$/p' "$SELF" | sed 's/^# \{0,1\}//'; }

SCALE_DIR=${SCALE_DIR:-/var/tmp/xfer-scale}
BENCH_DIR=$SCALE_DIR # gen_tree caches the source trees here
export PREFIX=${PREFIX:-xsc}
PORT=${PORT:-17530}
KEEP_RUN=${KEEP_RUN:-0}
NC=$SCRIPT_DIR/netcluster.sh
RUNS=$SCALE_DIR/run
RUN=$RUNS
RESULTS=$SCALE_DIR/results.csv
CSV_HEADER=stamp,xfer_rev,n,rate_mbit,size_mib,ideal_s,node_p50_x,node_p90_x,node_max_x,wall_x,hash_s,source_sent_x,source_ok_x,source_tc_x,wire_x,max_peer_links,cpu_s_per_gb,kernel_pct,xfer_cpu_pct,idle_pct
IDLE_FLOOR=20

# ticks_ut_st PID...: "utime stime" ticks summed over the PIDs.
ticks_ut_st() {
    local p
    for p in "$@"; do proc_times "$p"; done | awk '{ u += $1; s += $2 } END { printf "%.0f %.0f\n", u, s }'
}

CHURN=${CHURN:-0}
JOIN=${JOIN:-0}
# kill_late: stops a late agent churn started (not our child), if any.
kill_late() {
    local f
    for f in "$RUNS"/n*/late.pid; do
        [ -s "$f" ] && kill "$(cat "$f")" 2>/dev/null
        rm -f "$f"
    done
    return 0
}
# killed I: whether CHURN kills host I's agent.
killed() { [ "$1" -ge 2 ] && [ "$1" -le $((CHURN + 1)) ]; }

# churn N BYTES UP0 LATE (in the background during the push): kill -9 the
# agents of hosts 2..CHURN+1 once host 0's uplink has carried BYTES/3 since
# UP0, and start host LATE's agent (LATE > 0) once it has carried BYTES/2
# (its PID goes to $RUN/late.pid).
churn() {
    local n=$1 bytes=$2 up0=$3 late=$4 i sent killed_=0
    while :; do
        sent=$(($("$NC" bytes 0 eth0) - up0))
        if [ "$killed_" = 0 ] && [ $((sent * 3)) -ge "$bytes" ]; then
            for ((i = 2; i <= CHURN + 1; i++)); do kill -9 "${AGENT_PIDS[i]}" 2>/dev/null || true; done
            killed_=1
            [ "$CHURN" = 0 ] || log "N=$n: killed $CHURN agents at $((100 * sent / bytes)) % of S from the source"
        fi
        if [ "$late" -gt 0 ] && [ $((sent * 2)) -ge "$bytes" ]; then
            "$NC" exec "$late" "$RUN/xfer" serve --listen "$("$NC" ip "$late"):$PORT" --root "$SCALE_DIR/h$late" \
                --key "$RUN/cluster.key" >"$RUN/agent-$late.out" 2>"$RUN/agent-$late.err" 9>&- &
            echo $! >"$RUN/late.pid"
            log "N=$n: started host $late's agent at $((100 * sent / bytes)) % of S from the source"
            return 0
        fi
        [ "$late" -gt 0 ] || [ "$killed_" = 0 ] || return 0
        sleep 0.1
    done
}

# one_n N RATE SIZE SRC BYTES: one fresh cluster, one push, one table row
# (appended to ROWS) and one CSV line.
ROWS=()
one_n() {
    local n=$1 rate=$2 size=$3 src=$4 bytes=$5 i
    RUN=$RUNS/n$n
    rm -rf "$RUN" "$SCALE_DIR"/h[0-9]*
    mkdir -p "$RUN"
    cp "$RUNS/fp-source.txt" "$RUN/fp-source.txt"
    ln -f "$RUNS/xfer" "$RUNS/cluster.key" "$RUN/" # one binary for every N
    export XDG_CACHE_HOME=$RUN/cache # with --rehash: every push hashes the tree anew

    local ideal timeout_s
    ideal=$(calc "$bytes / ($rate * 1e6 / 8)")
    timeout_s=${PUSH_TIMEOUT:-$(awk -v s="$ideal" -v n="$n" 'BEGIN { printf "%d", 4 * n * s + 120 }')}
    log "N=$n: cluster of hosts 0..$n ($PREFIX-h*), $rate Mbit/s per link, MTU 1500; S/B $(fmt %.2f "$ideal") s"
    CLUSTER_UP=1
    MTU=1500 MGMT_NET=10.78.0 ROOT_ATTACH=0 FABRIC_MBIT='' "$NC" up "$n" "$rate"

    local to="" ip late=0
    [ "$JOIN" = 1 ] && late=$n
    AGENT_PIDS=()
    for ((i = 1; i <= n; i++)); do
        ip=$("$NC" ip "$i")
        to+="${to:+,}$ip:$PORT"
        mkdir -p "$SCALE_DIR/h$i"
        [ "$i" = "$late" ] || start_agent "$i" "$ip:$PORT" "$SCALE_DIR/h$i"
    done
    for ((i = 1; i <= n; i++)); do [ "$i" = "$late" ] || wait_agent "$i"; done
    sync

    log "N=$n: pushing (timeout ${timeout_s}s)"
    local up0 up1 all0 all1 cpu0 cpu1 a0 a1
    # CPU of the agents that live through the push (not the killed, whose
    # /proc entries go; not the late one, started during it).
    local live_pids=()
    for ((i = 1; i <= n; i++)); do
        killed "$i" || [ "$i" = "$late" ] || live_pids+=("${AGENT_PIDS[i]}")
    done
    a0=$(ticks_ut_st "${live_pids[@]}")
    up0=$("$NC" bytes 0 eth0)
    all0=$(link_bytes "$n" eth0)
    cpu0=$(cpu_idle_total)
    local churner=""
    if [ "$CHURN" -gt 0 ] || [ "$late" -gt 0 ]; then
        churn "$n" "$bytes" "$up0" "$late" &
        churner=$!
        track "$churner"
    fi
    run_push "$src" "$to" "$timeout_s"
    [ -z "$churner" ] || stop_pid "$churner"
    if [ "$late" -gt 0 ]; then
        [ -s "$RUN/late.pid" ] || die "the late agent on host $late never started (the source's uplink did not reach S/2)"
        AGENT_PIDS[late]=$(cat "$RUN/late.pid")
    fi
    cpu1=$(cpu_idle_total)
    up1=$("$NC" bytes 0 eth0)
    all1=$(link_bytes "$n" eth0)
    a1=$(ticks_ut_st "${live_pids[@]}")
    KILLED_ADDRS=$(for ((i = 2; i <= CHURN + 1; i++)); do echo "$("$NC" ip "$i"):$PORT"; done) check_push "$bytes" "$timeout_s"

    # CPU: the pusher's user/sys from time, the agents' utime/stime deltas.
    local user sys cpu kern idle ours
    read -r user sys < <(awk -v tck="$CLK_TCK" -v a0="$a0" -v a1="$a1" 'END {
        split(a0, x, " "); split(a1, y, " ")
        printf "%.3f %.3f\n", $3 + (y[1] - x[1]) / tck, $4 + (y[2] - x[2]) / tck }' "$RUN/push.time")
    cpu=$(calc "($user + $sys) / ($n * $bytes / 1e9)")
    kern=$(calc "100 * $sys / ($user + $sys)")
    ours=$(calc "100 * ($user + $sys) / (($PUSH_T1 - $PUSH_T0) * $(nproc))")
    idle=$(awk -v a="$cpu0" -v b="$cpu1" 'BEGIN { split(a, x, " "); split(b, y, " "); printf "%.1f", 100 * (y[1] - x[1]) / (y[2] - x[2]) }')

    for ((i = 1; i <= n; i++)); do
        if killed "$i"; then continue; fi
        if [ "$i" = "$late" ]; then
            kill "${AGENT_PIDS[i]}" 2>/dev/null || true # not our child: started by churn
        else
            stop_pid "${AGENT_PIDS[i]}"
        fi
        note_agent_log "$i"
    done
    for ((i = 1; i <= n; i++)); do killed "$i" || verify_tree "node $i" "$SCALE_DIR/h$i/$MODEL_NAME"; done
    rm -rf "$SCALE_DIR"/h[0-9]*

    local durs hash_s links src_ok p50 p90 pmax wall src_tc wire
    mapfile -t durs < <(jq -r '.nodes[] | select(.ok) | .duration_s' "$RUN/push.json")
    [ "${#durs[@]}" = "$((n - CHURN))" ] || die "the push's JSON lists ${#durs[@]} completed nodes, expected $((n - CHURN)) (see $RUN/push.json)"
    read -r hash_s links src_ok < <(jq -r '[.hash_s, ([.nodes[].max_peer_links // 0] | max),
        ([.nodes[].from_source // 0] | add) / .bytes_total] | @tsv' "$RUN/push.json")
    p50=$(calc "$(percentile 50 "${durs[@]}") / $ideal")
    p90=$(calc "$(percentile 90 "${durs[@]}") / $ideal")
    pmax=$(calc "$(maxof "${durs[@]}") / $ideal")
    wall=$(calc "($PUSH_T1 - $PUSH_T0) / $ideal")
    src_tc=$(calc "($up1 - $up0) / $bytes")
    wire=$(calc "($all1 - $all0) / ($n * $bytes)")
    local peer_pct=-
    if [ "$late" -gt 0 ]; then
        peer_pct=$(jq -r --argjson i "$((late - 1))" '.nodes[$i] | 100 * .from_peers / (.from_peers + .from_source) | floor' "$RUN/push.json")
        log "N=$n: the late node (host $late) got $peer_pct % of its bytes from peers"
    fi
    [ "$CHURN" = 0 ] || log "N=$n: $CHURN agents killed at S/3 (hosts 2..$((CHURN + 1))); figures over the $((n - CHURN)) that completed"
    log "N=$n: $((n - CHURN)) copies verified; node max $(fmt %.2f "$pmax") x S/B, wall $(fmt %.2f "$wall") x S/B, CPU idle $idle % (xfer used $(fmt %.1f "$ours") %)"
    if awk -v i="$idle" -v f="$IDLE_FLOOR" 'BEGIN { exit !(i < f) }'; then
        log "warning: N=$n: the CPU was idle only $idle % of the push (< $IDLE_FLOOR %): the machine, not the links, bounds this row; lower RATE_MBIT"
    fi

    ROWS+=("$(printf '%3d %5d %5d %6.2f  %5.2f %5.2f %5.2f  %5.2f  %5.2f %6.2f %6.2f %5.2f  %5d  %6.2f %5.1f %5.1f %5.1f %5s %5s' \
        "$n" "$rate" "$size" "$ideal" "$p50" "$p90" "$pmax" "$wall" "$SRC_X" "$src_ok" "$src_tc" "$wire" "$links" "$cpu" "$kern" "$ours" "$idle" "$CHURN" "$peer_pct")")
    [ -s "$RESULTS" ] || echo "$CSV_HEADER" >"$RESULTS"
    printf '%s,%s,%d,%d,%d,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%d,%.3f,%.1f,%.1f,%.1f\n' \
        "$STAMP" "$XFER_REV" "$n" "$rate" "$size" "$ideal" "$p50" "$p90" "$pmax" "$wall" "$hash_s" "$SRC_X" "$src_ok" "$src_tc" "$wire" \
        "$links" "$cpu" "$kern" "$ours" "$idle" >>"$RESULTS"
}

main() {
    local ns=$1 rate=$2 size=$3 n nmax=0
    [ -n "$ns" ] || die "NS is empty; give receiver counts such as \"8 16 24\""
    for n in $ns; do
        [[ $n =~ ^[0-9]+$ && $n -ge 1 && $n -le 60 ]] || die "each N in NS must be 1..60 (got '$n')"
        [ "$n" -le "$nmax" ] || nmax=$n
    done
    check_rate_size "$rate" "$size"
    netbench_preflight
    find_xfer
    exec 9>"$SCALE_DIR/.lock"
    flock -n 9 || die "another bench-scale run holds $SCALE_DIR/.lock; wait for it to finish"
    local avail need_mb
    avail=$(df -Pm "$SCALE_DIR" | awk 'NR == 2 { print $4 }')
    need_mb=$((size * (nmax + 3)))
    [ "$avail" -gt "$need_mb" ] || die "need ~$need_mb MiB free in $SCALE_DIR (source + $nmax copies), have $avail; lower SIZE_MIB or set SCALE_DIR"

    trap 'kill_late; netbench_cleanup' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    rm -rf "$RUNS" "$SCALE_DIR"/h[0-9]*
    mkdir -p "$RUNS"
    local t_start=$EPOCHREALTIME
    CLK_TCK=$(getconf CLK_TCK)
    STAMP=$(date -u +%Y%m%dT%H%M%SZ)
    unset XFER_CONGESTION XFER_KEY RUST_LOG

    local src bytes files
    src=$(gen_tree "$size")
    warm "$src"
    bytes=$(tree_bytes "$src")
    files=$(find "$src" -type f | wc -l)
    fingerprint "$src" >"$RUNS/fp-source.txt"
    RUN=$RUNS stage_xfer
    log "N = $ns at $rate Mbit/s; tree $src: $bytes bytes, $files files"

    for n in $ns; do one_n "$n" "$rate" "$size" "$src" "$bytes"; done
    RUN=$RUNS # the EXIT trap removes every run's folder unless KEEP_RUN=1

    {
        echo
        printf '== xfer scale bench: N = %s, %d Mbit/s per link (tbf both ways, MTU 1500), %d MiB tree (%d bytes, %d files), xfer %s, %d cores, %s ==\n' \
            "$ns" "$rate" "$size" "$bytes" "$files" "$XFER_REV" "$(nproc)" "$STAMP"
        echo "times x S/B (the baseline, the physical bound); node = each node's duration_s (its delivery, after hashing); wall = the whole push"
        printf '%3s %5s %5s %6s  %5s %5s %5s  %5s  %5s %6s %6s %5s  %5s  %6s %5s %5s %5s %5s %5s\n' \
            N Mbit MiB 'S/B s' p50 p90 max wall src_x src_ok src_tc wire links cpu/GB kern% xfer% idle% churn peer%
        printf '%s\n' "${ROWS[@]}"
    } | tee -a "$SCALE_DIR/summary.txt"
    log "took $(fmt %.0f "$(calc "$EPOCHREALTIME - $t_start")") s; rows appended to $RESULTS"
}

case ${1:-} in
-h | --help | help) usage ;;
*)
    [ $# -le 3 ] || {
        usage >&2
        exit 2
    }
    main "${1:-${NS:-8 16 24}}" "${2:-${RATE_MBIT:-100}}" "${3:-${SIZE_MIB:-128}}"
    ;;
esac
