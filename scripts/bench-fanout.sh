#!/usr/bin/env bash
# Fan-out benchmark: one source delivers a model to N nodes, every host link
# shaped to RATE Mbit/s in both directions (scripts/netcluster.sh).
#
#   scripts/bench-fanout.sh N RATE_MBIT SIZE_MIB        one run, prints a result block
#   scripts/bench-fanout.sh plot [RATE_MBIT SIZE_MIB]   N = 1 2 4 8 (default 200 Mbit/s,
#                                                       512 MiB), writes docs/fanout.{csv,png}
#
# One run measures, on hosts 0..N of a fresh cluster:
#   xfer   host 0 runs `xfer push --json --rehash` (private XDG_CACHE_HOME) to
#          one `xfer serve` per host 1..N. Transfer time = duration_s - hash_s
#          from the JSON; the whole command's wall time is shown as well.
#   rsync  a star: one rsync daemon per host 1..N, and host 0 runs N
#          `rsync -a --whole-file` clients in parallel, timed as a whole.
#   ideal  S/B, S = tree bytes, B = RATE*1e6/8 bytes/s: the source uploads
#          every byte at least once, and every node downloads S at B.
# Every copy is compared with the source by b3sum (the run fails otherwise).
# Also shown: CPU seconds per GB delivered (N x S), for xfer summed over the
# pusher and every agent, for rsync over its clients and daemons (with the
# children they fork); source bytes sent as a multiple of S (source_sent_x from the
# JSON when xfer reports it, else bytes_sent / bytes_total), the source's
# uplink bytes counted by tc, per-node from_source/from_peers when the JSON
# has them, and the peak RSS of every agent (VmHWM) and of the pusher.
# Each run appends n,rate,size_mib,ideal_s,xfer_s,rsync_s,source_x to
# $FANOUT_DIR/results.csv.
#
# Two networks (MGMT_MBIT set): every host gets a management link (eth0,
# 10.78.0.x) at MGMT_MBIT and a fabric (eth1, 10.79.0.x) at RATE_MBIT, both
# tbf-shaped both ways (netcluster.sh FABRIC_MBIT). Agents listen on
# 0.0.0.0:PORT (one socket, both networks); the push names each node as
# MGMT:PORT/FABRIC_IP (agent address / data address), so every chunk should
# ride the fabric; rsync's daemons and clients use the fabric addresses, as
# a user would. S/B is the fabric's. The result block adds the bytes tc
# counted on all management links and on all fabric links (every host's
# upload, so each packet counts once), in MiB, as % of S and as x S, for
# both tools. DATA_ADDRS=0 pushes with plain --to MGMT:PORT instead (what
# an xfer without data addresses does: everything over management).
#   MGMT_MBIT=40 scripts/bench-fanout.sh 4 400 256
#
# Runtime: a run takes about (xfer + rsync) transfer time + ~15 s of setup
# and checks. While xfer still delivers as a star both tools need ~N*S/B, so
# `plot` at its defaults (S/B = 21.5 s; N = 1+2+4+8) needs ~2*15*21.5 s plus
# setup and checks: 12.3 min measured on 2 cores. With peer-to-peer fan-out
# the xfer half shrinks. `plot 200 64` takes ~2.3 min.
#
# Env: XFER [$CARGO_TARGET_DIR or target/release/xfer], FANOUT_DIR
# [/var/tmp/xfer-fanout] (source tree cache, host roots h<i>/, results.csv;
# disk, not tmpfs), PREFIX [xfo] (namespace names, see netcluster.sh),
# PORT [17490] (xfer UDP; rsync daemons use PORT+1 TCP), PUSH_TIMEOUT
# [4*N*S/B + 120 s], PLOT_NS ["1 2 4 8"], KEEP_RUN [0] keeps logs and JSON,
# MGMT_MBIT [unset: one network] and DATA_ADDRS [1] (see above), PUSH_ARGS
# [none] (more arguments of the push, e.g. "--chunk-size 1MiB").
# Needs root (network namespaces; apt-get for missing tools).

set -euo pipefail
shopt -s inherit_errexit
export LC_ALL=C

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPT_DIR/.." && pwd)
SELF=$SCRIPT_DIR/$(basename "${BASH_SOURCE[0]}")
LOG_TAG=fanout
# shellcheck source=scripts/lib-bench.sh
source "$SCRIPT_DIR/lib-bench.sh"

usage() { sed -n '2,/^$/p' "$SELF" | sed 's/^# \{0,1\}//'; }

FANOUT_DIR=${FANOUT_DIR:-/var/tmp/xfer-fanout}
BENCH_DIR=$FANOUT_DIR # gen_tree caches the source trees here
export PREFIX=${PREFIX:-xfo}
PORT=${PORT:-17490}
RPORT=$((PORT + 1))
KEEP_RUN=${KEEP_RUN:-0}
PLOT_NS=${PLOT_NS:-1 2 4 8}
NC=$SCRIPT_DIR/netcluster.sh
RUN=$FANOUT_DIR/run
RESULTS=$FANOUT_DIR/results.csv
CSV_HEADER=n,rate,size_mib,ideal_s,xfer_s,rsync_s,source_x
MGMT_MBIT=${MGMT_MBIT:-}
DATA_ADDRS=${DATA_ADDRS:-1}

preflight() {
    netbench_preflight
    need rsync rsync
}

# uplink_bytes: bytes host 0 has sent so far, by its tbf qdisc(s).
uplink_bytes() {
    if [ -n "$MGMT_MBIT" ]; then
        echo $(($("$NC" bytes 0 eth0) + $("$NC" bytes 0 eth1)))
    else
        "$NC" bytes 0 eth0
    fi
}
# ---------------------------------------------------------------- one run ----

run_one() {
    local n=$1 rate=$2 size=$3 i
    [[ $n =~ ^[0-9]+$ && $n -ge 1 && $n -le 60 ]] || die "N must be 1..60 (got '$n')"
    check_rate_size "$rate" "$size"
    preflight
    find_xfer
    exec 9>"$FANOUT_DIR/.lock"
    flock -n 9 || die "another bench-fanout run holds $FANOUT_DIR/.lock; wait for it to finish"
    local avail need_mb
    avail=$(df -Pm "$FANOUT_DIR" | awk 'NR == 2 { print $4 }')
    need_mb=$((size * (n + 3)))
    [ "$avail" -gt "$need_mb" ] || die "need ~$need_mb MiB free in $FANOUT_DIR (source + $n copies), have $avail; lower SIZE_MIB or set FANOUT_DIR"

    trap netbench_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    rm -rf "$RUN" "$FANOUT_DIR"/h[0-9]*
    mkdir -p "$RUN"
    local t_start=$EPOCHREALTIME
    CLK_TCK=$(getconf CLK_TCK)

    local src bytes files
    src=$(gen_tree "$size")
    warm "$src"
    bytes=$(tree_bytes "$src")
    files=$(find "$src" -type f | wc -l)
    fingerprint "$src" >"$RUN/fp-source.txt"
    if [ -n "$MGMT_MBIT" ]; then
        posint "$MGMT_MBIT" || die "MGMT_MBIT must be a positive integer (got '$MGMT_MBIT')"
    fi
    local ideal timeout_s
    ideal=$(calc "$bytes / ($rate * 1e6 / 8)")
    timeout_s=${PUSH_TIMEOUT:-$(awk -v s="$ideal" -v n="$n" 'BEGIN { printf "%d", 4 * n * s + 120 }')}

    stage_xfer
    unset XFER_CONGESTION XFER_KEY RUST_LOG
    export XDG_CACHE_HOME=$RUN/cache # with --rehash: every push hashes the tree anew

    CLUSTER_UP=1
    # ips: where each tool sends data (the fabric when there is one);
    # listen: where agents listen; to: what the push is given.
    local ips=() to="" listen=() nets
    if [ -n "$MGMT_MBIT" ]; then
        nets="management $MGMT_MBIT Mbit/s (eth0) + fabric $rate Mbit/s (eth1) per host"
        log "cluster: hosts 0..$n ($PREFIX-h*), $nets; tree $src: $bytes bytes, $files files; S/B of the fabric $(fmt %.2f "$ideal") s"
        MGMT_NET=10.78.0 FABRIC_NET=10.79.0 FABRIC_MBIT=$rate ROOT_ATTACH=0 "$NC" up "$n" "$MGMT_MBIT"
    else
        nets="$rate Mbit/s per link"
        log "cluster: hosts 0..$n ($PREFIX-h*), $nets; tree $src: $bytes bytes, $files files; S/B $(fmt %.2f "$ideal") s"
        MGMT_NET=10.78.0 ROOT_ATTACH=0 "$NC" up "$n" "$rate"
    fi
    for ((i = 1; i <= n; i++)); do
        if [ -n "$MGMT_MBIT" ]; then
            ips[i]=$("$NC" fip "$i")
            listen[i]=0.0.0.0:$PORT
            if [ "$DATA_ADDRS" = 1 ]; then
                to+="${to:+,}$("$NC" ip "$i"):$PORT/${ips[i]}"
            else
                to+="${to:+,}$("$NC" ip "$i"):$PORT"
            fi
        else
            ips[i]=$("$NC" ip "$i")
            listen[i]=${ips[i]}:$PORT
            to+="${to:+,}${ips[i]}:$PORT"
        fi
        mkdir -p "$FANOUT_DIR/h$i/xfer" "$FANOUT_DIR/h$i/rsync"
    done
    sync

    # ---- xfer: one agent per node, one push from host 0
    for ((i = 1; i <= n; i++)); do start_agent "$i" "${listen[i]}" "$FANOUT_DIR/h$i/xfer"; done
    for ((i = 1; i <= n; i++)); do wait_agent "$i"; done

    log "xfer: pushing to $n agents (timeout ${timeout_s}s)"
    local up0 up1 t0 t1 mg0=0 mg1=0 fb0=0 fb1=0 a0=()
    for ((i = 1; i <= n; i++)); do a0[i]=$(proc_ticks "${AGENT_PIDS[i]}"); done
    up0=$(uplink_bytes)
    if [ -n "$MGMT_MBIT" ]; then
        mg0=$(link_bytes "$n" eth0)
        fb0=$(link_bytes "$n" eth1)
    fi
    run_push "$src" "$to" "$timeout_s"
    up1=$(uplink_bytes)
    if [ -n "$MGMT_MBIT" ]; then
        mg1=$(link_bytes "$n" eth0)
        fb1=$(link_bytes "$n" eth1)
    fi
    local x_wall x_up_x
    x_wall=$(calc "$PUSH_T1 - $PUSH_T0")
    x_up_x=$(calc "($up1 - $up0) / $bytes")
    check_push "$bytes" "$timeout_s"
    local j_hash j_dur src_x=$SRC_X src_x_from=$SRC_X_FROM
    read -r j_hash j_dur < <(jq -r '[.hash_s, .duration_s] | @tsv' "$RUN/push.json")
    # The push's timeline (seconds on its clock, which starts at hashing).
    local t_conn t_acc t_first t_done t_closed t_ret
    read -r t_conn t_acc t_first t_done t_closed t_ret < <(jq -r '.timeline // {} |
        [.connected_s // 0, .accepted_s // 0, .first_chunk_s // 0, .done_s // 0, .closed_s // 0, .returned_s // 0] | @tsv' "$RUN/push.json")
    local x_s push_rss rss=() x_cpu
    x_s=$(calc "$j_dur - $j_hash")
    push_rss=$(awk 'END { print $2 }' "$RUN/push.time")
    # CPU seconds of every xfer process: the pusher (user + sys, from time)
    # and each agent's utime + stime during the push.
    x_cpu=$(awk 'END { print $3 + $4 }' "$RUN/push.time")
    for ((i = 1; i <= n; i++)); do
        x_cpu=$(calc "$x_cpu + ($(proc_ticks "${AGENT_PIDS[i]}") - ${a0[i]}) / $CLK_TCK")
        rss[i]=$(awk '/^VmHWM:/ { print $2 }' "/proc/${AGENT_PIDS[i]}/status" 2>/dev/null || echo 0)
        stop_pid "${AGENT_PIDS[i]}"
        note_agent_log "$i"
    done
    for ((i = 1; i <= n; i++)); do verify_tree "xfer node $i" "$FANOUT_DIR/h$i/xfer/$MODEL_NAME"; done
    log "xfer: $(fmt %.2f "$x_s") s transfer, $(fmt %.2f "$x_wall") s whole command; $n copies verified"
    rm -rf "$FANOUT_DIR"/h[0-9]*/xfer
    sync

    # ---- rsync star: one daemon per node, N parallel clients on host 0
    local dpid=() tries
    for ((i = 1; i <= n; i++)); do
        cat >"$RUN/rsyncd-$i.conf" <<EOF
pid file = $RUN/rsyncd-$i.pid
log file = $RUN/rsyncd-$i.log
address = ${ips[i]}
port = $RPORT
use chroot = no
uid = root
gid = root
[fanout]
    path = $FANOUT_DIR/h$i/rsync
    read only = false
EOF
        "$NC" exec "$i" rsync --daemon --no-detach --config="$RUN/rsyncd-$i.conf" >"$RUN/rsyncd-$i.out" 2>&1 &
        dpid[i]=$!
        track "${dpid[i]}"
    done
    for ((i = 1; i <= n; i++)); do
        for ((tries = 0; tries < 100; tries++)); do
            if [ -n "$("$NC" exec "$i" ss -Hltn "sport = :$RPORT")" ]; then break; fi
            kill -0 "${dpid[i]}" 2>/dev/null || die "rsync daemon on host $i exited: $(tail -n3 "$RUN/rsyncd-$i.out" | tr '\n' ' ')"
            sleep 0.1
        done
        [ -n "$("$NC" exec "$i" ss -Hltn "sport = :$RPORT")" ] || die "rsync daemon on host $i is not listening on TCP $RPORT after 10 s"
    done

    log "rsync: $n parallel rsync -a --whole-file clients from host 0"
    local cpid=() crc=() failed="" rmg0=0 rmg1=0 rfb0=0 rfb1=0 d0=()
    for ((i = 1; i <= n; i++)); do d0[i]=$(proc_ticks "${dpid[i]}" 1); done
    up0=$(uplink_bytes)
    if [ -n "$MGMT_MBIT" ]; then
        rmg0=$(link_bytes "$n" eth0)
        rfb0=$(link_bytes "$n" eth1)
    fi
    t0=$EPOCHREALTIME
    for ((i = 1; i <= n; i++)); do
        /usr/bin/time -f '%e %M %U %S' -o "$RUN/rsync-$i.time" \
            "$NC" exec 0 timeout -s INT "$timeout_s" rsync -a --whole-file "$src/" "rsync://${ips[i]}:$RPORT/fanout/$MODEL_NAME/" \
            >"$RUN/rsync-$i.out" 2>&1 &
        cpid[i]=$!
        track "${cpid[i]}"
    done
    for ((i = 1; i <= n; i++)); do
        crc[i]=0
        wait "${cpid[i]}" || crc[i]=$?
        untrack "${cpid[i]}"
        [ "${crc[i]}" = 0 ] || failed+=" host $i: exit ${crc[i]} $(tail -n 2 "$RUN/rsync-$i.out" | tr '\n' ' ')"
    done
    t1=$EPOCHREALTIME
    up1=$(uplink_bytes)
    if [ -n "$MGMT_MBIT" ]; then
        rmg1=$(link_bytes "$n" eth0)
        rfb1=$(link_bytes "$n" eth1)
    fi
    [ -z "$failed" ] || die "rsync failed:$failed"
    local r_s r_up_x r_cpu=0
    r_s=$(calc "$t1 - $t0")
    r_up_x=$(calc "($up1 - $up0) / $bytes")
    # CPU seconds of every rsync process: the clients (from time) and each
    # daemon with the children it forked per connection, once reaped.
    for ((i = 1; i <= n; i++)); do
        for ((tries = 0; tries < 200; tries++)); do
            if ! pgrep -P "${dpid[i]}" >/dev/null; then break; fi
            sleep 0.05
        done
        r_cpu=$(calc "$r_cpu + $(awk 'END { print $3 + $4 }' "$RUN/rsync-$i.time") + ($(proc_ticks "${dpid[i]}" 1) - ${d0[i]}) / $CLK_TCK")
    done
    for ((i = 1; i <= n; i++)); do stop_pid "${dpid[i]}"; done
    for ((i = 1; i <= n; i++)); do verify_tree "rsync node $i" "$FANOUT_DIR/h$i/rsync/$MODEL_NAME"; done
    log "rsync: $(fmt %.2f "$r_s") s; $n copies verified"

    # ---- report
    local rows=() node nsent nsrc npeer ndur
    rows+=("node"$'\t'"addr"$'\t'"xfer_s"$'\t'"sent_MiB"$'\t'"from_source_MiB"$'\t'"from_peers_MiB"$'\t'"agent_rss_MiB"$'\t'"rsync_s"$'\t'"rsync_rss_MiB")
    for ((i = 1; i <= n; i++)); do
        node=$(jq -c --argjson k "$((i - 1))" '.nodes[$k] // {}' "$RUN/push.json")
        read -r nsent nsrc npeer ndur < <(jq -r '[.bytes_sent // "-", .from_source // "-", .from_peers // "-", .duration_s // "n/a"] | @tsv' <<<"$node")
        rows+=("$i"$'\t'"${ips[i]}:$PORT"$'\t'"$(fmt %.2f "$ndur")"$'\t'"$(mib "$nsent")"$'\t'"$(mib "$nsrc")"$'\t'"$(mib "$npeer")"$'\t'"$(fmt %.1f "$(calc "${rss[i]:-0} / 1024")")"$'\t'"$(awk 'END { print $1 }' "$RUN/rsync-$i.time")"$'\t'"$(fmt %.1f "$(calc "$(awk 'END { print $2 }' "$RUN/rsync-$i.time") / 1024")")")
    done
    local stamp
    stamp=$(date -u +%Y%m%dT%H%M%SZ)
    {
        echo
        printf '== xfer fan-out: N=%d nodes, %s, %d MiB tree (%d bytes, %d files), xfer %s, %d cores, %s ==\n' \
            "$n" "$nets" "$size" "$bytes" "$files" "$XFER_REV" "$(nproc)" "$stamp"
        printf '%-34s %8.2f s\n' "ideal S/B" "$ideal"
        printf '%-34s %8.2f s  %5.2f x S/B\n' "xfer push, transfer (dur - hash)" "$x_s" "$(calc "$x_s / $ideal")"
        printf '%-34s %8.2f s  %5.2f x S/B  (hash_s %.2f)\n' "xfer push, whole command" "$x_wall" "$(calc "$x_wall / $ideal")" "$j_hash"
        printf '%-34s hashed %.2f, connected %.2f, accepted %.2f, first chunk %.2f, done %.2f, closed %.2f, returned %.2f s\n' \
            "xfer timeline (push's clock)" "$j_hash" "$t_conn" "$t_acc" "$t_first" "$t_done" "$t_closed" "$t_ret"
        # The whole command's gap over S/B, in parts that add up to it.
        printf '%-34s %+.2f s = before the first chunk %.2f + stream over S/B %+.2f + close %.2f + process start/exit %.2f\n' \
            "xfer gap (whole command - S/B)" "$(calc "$x_wall - $ideal")" "$t_first" "$(calc "$t_done - $t_first - $ideal")" \
            "$(calc "$t_ret - $t_done")" "$(calc "$x_wall - $t_ret")"
        printf '%-34s %8.2f s  %5.2f x S/B\n' "rsync star, $n parallel clients" "$r_s" "$(calc "$r_s / $ideal")"
        printf '%-34s %8s\n' "rsync / xfer (transfer)" "$(ratio "$r_s" "$x_s")"
        printf '%-34s %8.2f x S  (%s)\n' "source sent by xfer" "$src_x" "$src_x_from"
        printf '%-34s %8.2f x S  xfer, %.2f x S rsync (packets incl. headers)\n' "source uplink on the wire (tc)" "$x_up_x" "$r_up_x"
        printf '%-34s %8.2f s  xfer (pusher + %d agents), %.2f s rsync (clients + daemons)\n' "CPU per GB delivered (N x S)" \
            "$(calc "$x_cpu / ($n * $bytes / 1e9)")" "$n" "$(calc "$r_cpu / ($n * $bytes / 1e9)")"
        if [ -n "$MGMT_MBIT" ]; then
            printf '%-34s %8s\n' "xfer push given" "$(if [ "$DATA_ADDRS" = 1 ]; then echo "MGMT:$PORT/FABRIC (data addresses)"; else echo "MGMT:$PORT only (DATA_ADDRS=0)"; fi)"
            printf '%-34s %8.1f MiB  %6.2f %% of S  xfer, %.1f MiB (%.2f %%) rsync\n' "management links (tc, all hosts)" \
                "$(calc "($mg1 - $mg0) / 1048576")" "$(calc "100 * ($mg1 - $mg0) / $bytes")" \
                "$(calc "($rmg1 - $rmg0) / 1048576")" "$(calc "100 * ($rmg1 - $rmg0) / $bytes")"
            printf '%-34s %8.1f MiB  %6.2f x S    xfer, %.1f MiB (%.2f x S) rsync\n' "fabric links (tc, all hosts)" \
                "$(calc "($fb1 - $fb0) / 1048576")" "$(calc "($fb1 - $fb0) / $bytes")" \
                "$(calc "($rfb1 - $rfb0) / 1048576")" "$(calc "($rfb1 - $rfb0) / $bytes")"
        fi
        printf '%-34s %8.1f MiB\n' "peak RSS xfer pusher" "$(calc "$push_rss / 1024")"
        printf '%s\n' "${rows[@]}" | column -t -s $'\t'
    } | tee -a "$FANOUT_DIR/summary.txt"

    local row
    row=$(printf '%d,%d,%d,%.3f,%.3f,%.3f,%.3f' "$n" "$rate" "$size" "$ideal" "$x_s" "$r_s" "$src_x")
    [ -s "$RESULTS" ] || echo "$CSV_HEADER" >"$RESULTS"
    echo "$row" >>"$RESULTS"
    if [ -n "${FANOUT_ROW_OUT:-}" ]; then
        printf '%s,%.3f,%s\n' "$row" "$x_wall" "$XFER_REV" >>"$FANOUT_ROW_OUT"
    fi
    log "run took $(fmt %.0f "$(calc "$EPOCHREALTIME - $t_start")") s; appended to $RESULTS"
}

# ---------------------------------------------------------------- plot ----

plot() {
    local rate=${1:-200} size=${2:-512} n
    check_rate_size "$rate" "$size"
    preflight
    find_xfer
    need gnuplot gnuplot-nox
    local rowfile=$FANOUT_DIR/plot-rows.csv t0=$EPOCHREALTIME
    : >"$rowfile"
    log "plot: N = $PLOT_NS at $rate Mbit/s, $size MiB"
    for n in $PLOT_NS; do
        FANOUT_ROW_OUT=$rowfile "$SELF" "$n" "$rate" "$size" || die "the run with N=$n failed (its log is above); fix that first"
    done
    mkdir -p "$REPO/docs"
    local csv=$REPO/docs/fanout.csv png=$REPO/docs/fanout.png
    {
        echo "$CSV_HEADER,xfer_whole_s,xfer_rev"
        cat "$rowfile"
    } >"$csv"
    rm -f "$rowfile"
    # Label a plot made while xfer still delivers as a star (source sends ~N*S).
    local note="" xtics nmax
    note=$(awk -F, 'NR > 1 && $1 > 1 && $7 >= 0.9 * $1 { star = 1 } END { if (star) print "\\n(star build: xfer sent ~N·S from the source; not peer-to-peer fan-out)" }' "$csv")
    xtics=$(awk -F, 'NR > 1 { printf "%s%s", sep, $1; sep = "," }' "$csv")
    nmax=$(awk -F, 'NR > 1 && $1 > m { m = $1 } END { print m }' "$csv")
    local term="pngcairo size 960,640 font 'Sans,11'"
    gnuplot -e 'set terminal' 2>&1 | grep -q pngcairo || term="png size 960,640"
    gnuplot <<EOF
set terminal $term
set termoption noenhanced
set output '$png'
set datafile separator ','
set title "Time to deliver a $size MiB model to N nodes, $rate Mbit/s per link (xfer $XFER_REV)$note"
set xlabel 'nodes N'
set ylabel 'seconds until every node holds the model'
set logscale x 2
set xtics ($xtics)
set xrange [0.8:$nmax * 1.25]
set yrange [0:*]
set grid
set key top left
plot '$csv' skip 1 using 1:5 with linespoints lw 2 pt 7 title 'xfer push (duration_s - hash_s)', \
     '' skip 1 using 1:6 with linespoints lw 2 pt 5 title 'rsync star (N parallel rsync -a --whole-file)', \
     '' skip 1 using 1:4 with lines lw 2 dt 2 title 'ideal S/B', \
     '' skip 1 using 1:(\$1 * \$4) with lines lw 1 dt 3 lc rgb 'gray40' title 'star bound N*S/B'
EOF
    log "plot: wrote $csv and $png in $(fmt %.0f "$(calc "$EPOCHREALTIME - $t0")") s"
    column -t -s, "$csv"
}

case ${1:-} in
plot)
    [ $# -le 3 ] || {
        usage >&2
        exit 2
    }
    plot "${2:-200}" "${3:-512}"
    ;;
-h | --help | help) usage ;;
*)
    [ $# -eq 3 ] || {
        usage >&2
        exit 2
    }
    run_one "$1" "$2" "$3"
    ;;
esac
