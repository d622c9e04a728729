#!/usr/bin/env bash
# Image delivery benchmark: `xfer image push` against the by-hand way,
# `docker save IMAGE | ssh node docker load` (here nc instead of ssh), to two
# nodes over tc-shaped links (scripts/netcluster.sh), each host with a Docker
# daemon of its own (scripts/dockerd.sh).
#
#   scripts/bench-image.sh [all|byhand|clean]   (default: all)
#
#   all     both halves; when the xfer binary has no `image push` the xfer
#           half is reported as n/a and only the by-hand half runs
#   byhand  only the by-hand half (no xfer build)
#   clean   remove BENCH_DIR (the source daemon's data with its images)
#
# Hosts (netcluster, PREFIX xfim): host 0 is the operator, with the source
# dockerd holding the images; hosts 1 and 2 are nodes, each with a dockerd
# of its own and (xfer half) an agent
#   DOCKER_HOST=unix://.../docker.sock xfer serve --listen IP:PORT --root ROOT
#       --key KEY --container-engine docker
# The image xt/app:1 is busybox plus a base layer of BASE_MIB MiB of random
# bytes and a top layer of TOP_MIB MiB; xt/app:2 is the same base layer with
# another top layer (scripts/dockerd.sh images). Both are built once and
# kept in BENCH_DIR/src-docker.
#   A  first delivery of xt/app:1, nodes empty:
#      by hand: for node 1, then node 2: `nc -d -l PORT | docker load` in the
#      node, `docker save xt/app:1 | nc -N NODE PORT` on host 0; timed as a
#      whole. Then `docker rmi` on the nodes (nothing left), then
#      xfer: `xfer image push xt/app:1 --to N1:PORT,N2:PORT --key KEY --json`
#      on host 0 (DOCKER_HOST = host 0's daemon, a private --cache), timed.
#   B  re-delivery of xt/app:2, nodes holding xt/app:1 (from A):
#      by hand again (`docker load` receives the whole tar), `docker rmi
#      xt/app:2` on the nodes, then xfer image push xt/app:2 (the agents
#      still hold xt/app:1's blobs: only the new top layer and the config
#      should go).
# At the end every node's `docker image inspect --format '{{.Id}}'` of both
# images must equal the source's. Reported: wall seconds, ratio by-hand /
# xfer, bytes (tar size S per node by hand; bytes_sent from xfer's JSON, the
# sum of its per-blob pushes), the bytes tc counted on host 0's uplink and on
# all uplinks, the machine's CPU busy share during each (2 cores: 100 % means
# CPU-bound, not link-bound), and the physical floor S/B (B = LINK_MBIT
# * 1e6 / 8 bytes/s: every node must download S at B; by hand in turn needs
# 2 S through host 0's uplink, so 2 S/B).
#
# Env (defaults in brackets):
#   BASE_MIB [900] TOP_MIB [100]   the image's layers (~1 GiB); e.g. 64 and 8
#                                  for a quick run
#   LINK_MBIT [1000]   every host link, tbf-shaped both ways (netcluster)
#   BENCH_DIR [/var/tmp/xfer-bench-image]  disk, not tmpfs; needs ~4 x the image
#   PORT [7470]        agents' UDP port; NC_PORT [17491] the by-hand TCP port
#   PUSH_TIMEOUT [20 x 2 S/B + 300 s]  per push or save|load
#   XFER [unset]       run this xfer binary instead of building one
#   PREFIX [xfim]      namespace names (netcluster.sh)
#   KEEP_RUN [0]       1 keeps logs and JSON in BENCH_DIR/run
# Needs root (network namespaces, dockerd; apt-get for missing tools).

set -euo pipefail
shopt -s inherit_errexit
export LC_ALL=C

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPT_DIR/.." && pwd)
SELF=$SCRIPT_DIR/$(basename "${BASH_SOURCE[0]}")
LOG_TAG=bench-image
# shellcheck source=scripts/lib-bench.sh
source "$SCRIPT_DIR/lib-bench.sh"
# shellcheck source=scripts/dockerd.sh
source "$SCRIPT_DIR/dockerd.sh"

usage() { sed -n '2,52p' "$SELF" | sed 's/^# \{0,1\}//'; }

PART=${1:-all}
case $PART in
all | byhand | clean) ;;
-h | --help | help)
    usage
    exit 0
    ;;
*)
    usage >&2
    exit 2
    ;;
esac

BENCH_DIR=${BENCH_DIR:-/var/tmp/xfer-bench-image}
BASE_MIB=${BASE_MIB:-900}
TOP_MIB=${TOP_MIB:-100}
LINK_MBIT=${LINK_MBIT:-1000}
PORT=${PORT:-7470}
NC_PORT=${NC_PORT:-17491}
KEEP_RUN=${KEEP_RUN:-0}
export PREFIX=${PREFIX:-xfim}
NC=$SCRIPT_DIR/netcluster.sh
RUN=$BENCH_DIR/run
SRC_DOCKER=$BENCH_DIR/src-docker
IMG1=xt/app:1
IMG2=xt/app:2

if [ "$PART" = clean ]; then
    dockerd_stop "$SRC_DOCKER" || true
    rm -rf "$BENCH_DIR"
    log "removed $BENCH_DIR"
    exit 0
fi

[ "$(id -u)" = 0 ] || die "run as root (network namespaces, dockerd, apt-get)"
for v in BASE_MIB TOP_MIB LINK_MBIT; do
    [[ ${!v} =~ ^[0-9]+$ && ${!v} -ge 1 ]] || die "$v must be a positive integer"
done

# ---------------------------------------------------------------- tools ----

need jq jq
need nc netcat-openbsd
need ss iproute2
need tc iproute2
need timeout coreutils
need ping iputils-ping
need flock util-linux
dockerd_install
nc -h 2>&1 | grep -q OpenBSD || die "nc is not OpenBSD netcat (apt-get install netcat-openbsd)"

mkdir -p "$BENCH_DIR"
[ "$(stat -f -c %T "$BENCH_DIR")" != tmpfs ] || die "BENCH_DIR=$BENCH_DIR is on tmpfs; point it at a disk filesystem"
exec 9>"$BENCH_DIR/.lock"
flock -n 9 || die "another bench-image run holds $BENCH_DIR/.lock"
avail=$(df -Pm "$BENCH_DIR" | awk 'NR == 2 { print $4 }')
need_mb=$(((BASE_MIB + 2 * TOP_MIB) * 6 + 512))
[ "$avail" -gt "$need_mb" ] || die "need ~$need_mb MiB free in $BENCH_DIR, have $avail"

# ---------------------------------------------------------------- setup ----

CLUSTER_UP=0
DAEMONS=()
cleanup() {
    local rc=$?
    set +e
    trap - EXIT INT TERM
    stop_all
    local d
    for d in "${DAEMONS[@]}"; do dockerd_stop "$d"; done
    if [ "$CLUSTER_UP" = 1 ]; then "$NC" down; fi
    if [ "$rc" != 0 ]; then
        log "FAILED (exit $rc); logs and JSON kept in $RUN"
    elif [ "$KEEP_RUN" = 1 ]; then
        log "logs kept in $RUN"
    else
        rm -rf "$RUN"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

for d in "$RUN"/d[0-9]*; do [ ! -d "$d" ] || dockerd_stop "$d"; done
rm -rf "$RUN"
mkdir -p "$RUN"

PROBLEMS=()
note() {
    log "PROBLEM: $*"
    PROBLEMS+=("$*")
}

HAVE_XFER=0
GIT_REV=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ -n "$(git -C "$REPO" status --porcelain -- xfer 2>/dev/null)" ]; then GIT_REV+=+dirty; fi
if [ "$PART" = all ]; then
    if [ -n "${XFER:-}" ]; then
        [ -x "$XFER" ] || die "XFER=$XFER is not an executable"
        cp "$XFER" "$RUN/xfer"
        GIT_REV="XFER=$XFER"
    else
        log "building xfer (release)"
        (cd "$REPO" && cargo build --release -p xfer >&2) || die "cargo build --release -p xfer failed (scripts/bench-image.sh byhand runs without it)"
        # A private copy: a rebuild elsewhere cannot swap the binary mid-run.
        cp "${CARGO_TARGET_DIR:-$REPO/target}/release/xfer" "$RUN/xfer"
    fi
    XFER=$RUN/xfer
    if "$XFER" image push --help >/dev/null 2>&1; then
        HAVE_XFER=1
    else
        note "this xfer has no 'image push' ($GIT_REV): the xfer half is n/a"
    fi
fi

LINE_RATE=$((LINK_MBIT * 1000000 / 8)) # bytes/s
CLUSTER_UP=1
log "cluster: hosts 0..2 ($PREFIX-h*), $LINK_MBIT Mbit/s per link (tbf, both ways)"
MGMT_NET=10.78.0 ROOT_ATTACH=0 "$NC" up 2 "$LINK_MBIT"
NS=("$PREFIX-h0" "$PREFIX-h1" "$PREFIX-h2")
IP=("" "$("$NC" ip 1)" "$("$NC" ip 2)")

# Daemons: host 0's keeps its data (the images) in BENCH_DIR; the nodes'
# start empty every run.
DAEMONS+=("$SRC_DOCKER")
SOCK0=$(dockerd_start "$SRC_DOCKER" "${NS[0]}")
SOCK=("$SOCK0")
for i in 1 2; do
    DAEMONS+=("$RUN/d$i")
    SOCK[i]=$(dockerd_start "$RUN/d$i" "${NS[i]}")
done
t0=$EPOCHREALTIME
XT_STANDIN=0 dockerd_images "$SOCK0" "$BASE_MIB" "$TOP_MIB" >"$RUN/images.txt"
log "images in host 0's daemon ($(fmt %.1f "$(elapsed "$t0" "$EPOCHREALTIME")") s): $(tr '\n' ' ' <"$RUN/images.txt")"

dk() { # dk HOST ARGS...: docker against that host's daemon
    local h=$1
    shift
    DOCKER_HOST=${SOCK[h]} docker "$@"
}
img_id() { dk "$1" image inspect --format '{{.Id}}' "$2" 2>/dev/null || echo none; }
ID1=$(img_id 0 "$IMG1")
ID2=$(img_id 0 "$IMG2")
# The tar docker save writes, S (also warms the page cache for both halves).
S1=$(dk 0 save "$IMG1" | wc -c)
S2=$(dk 0 save "$IMG2" | wc -c)
LAYERS1=$(dk 0 image inspect --format '{{json .RootFS.Layers}}' "$IMG1" | jq length)
log "$IMG1 $ID1: $S1 bytes saved ($LAYERS1 layers); $IMG2 $ID2: $S2 bytes"
FLOOR1=$(calc "$S1 / $LINE_RATE")
FLOOR2=$(calc "$S2 / $LINE_RATE")
TIMEOUT=${PUSH_TIMEOUT:-$(awk -v f="$FLOOR1" 'BEGIN { printf "%d", 40 * f + 300 }')}

# cpu_busy: busy and total jiffies of the whole machine so far.
cpu_busy() { awk '/^cpu / { t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6, t }' /proc/stat; }
busy_pct() { # busy_pct "B0 T0" "B1 T1"
    awk -v a="$1" -v b="$2" 'BEGIN { split(a, x, " "); split(b, y, " "); if (y[2] == x[2]) print "n/a"; else printf "%.0f", 100 * (y[1] - x[1]) / (y[2] - x[2]) }'
}
all_up() { echo $(($("$NC" bytes 0 eth0) + $("$NC" bytes 1 eth0) + $("$NC" bytes 2 eth0))); }

# ---------------------------------------------------------------- by hand ----

# byhand LABEL IMAGE ID: save|nc -> nc|load to node 1, then node 2. Sets
# H_WALL, H_UP0 (host 0 uplink bytes), H_UP (all uplinks), H_CPU (busy %).
byhand() {
    local label=$1 img=$2 id=$3 i t0 t1 c0 c1 u0 u1 a0 a1
    c0=$(cpu_busy)
    u0=$("$NC" bytes 0 eth0)
    a0=$(all_up)
    t0=$EPOCHREALTIME
    for i in 1 2; do
        local lpid k rc=0
        DOCKER_HOST=${SOCK[i]} ip netns exec "${NS[i]}" timeout "$TIMEOUT" sh -c \
            "nc -d -l $NC_PORT | docker load" >"$RUN/load-$label-$i.out" 2>"$RUN/load-$label-$i.err" &
        lpid=$!
        track "$lpid"
        for ((k = 0; k < 100; k++)); do
            [ -z "$(ip netns exec "${NS[i]}" ss -Hntl "sport = :$NC_PORT")" ] || break
            sleep 0.05
        done
        [ -n "$(ip netns exec "${NS[i]}" ss -Hntl "sport = :$NC_PORT")" ] || die "$label: nc did not listen on host $i"
        DOCKER_HOST=${SOCK[0]} ip netns exec "${NS[0]}" timeout "$TIMEOUT" bash -o pipefail -c \
            "docker save '$img' | nc -N ${IP[i]} $NC_PORT" >"$RUN/save-$label-$i.out" 2>&1 || rc=$?
        [ "$rc" = 0 ] || die "$label: docker save | nc to host $i exited $rc: $(tail -n3 "$RUN/save-$label-$i.out" | tr '\n' ' ')"
        wait "$lpid" || rc=$?
        untrack "$lpid"
        [ "$rc" = 0 ] || die "$label: nc | docker load on host $i exited $rc: $(tail -n3 "$RUN/load-$label-$i.err" | tr '\n' ' ')"
    done
    t1=$EPOCHREALTIME
    c1=$(cpu_busy)
    u1=$("$NC" bytes 0 eth0)
    a1=$(all_up)
    H_WALL=$(elapsed "$t0" "$t1")
    H_UP0=$((u1 - u0))
    H_UP=$((a1 - a0))
    H_CPU=$(busy_pct "$c0" "$c1")
    for i in 1 2; do
        local got
        got=$(img_id "$i" "$img")
        [ "$got" = "$id" ] || die "$label: host $i holds $img as $got, the source as $id ($(cat "$RUN/load-$label-$i.out" "$RUN/load-$label-$i.err" | tail -n3 | tr '\n' ' '))"
    done
    log "$(printf '%-16s %7.2f s  host 0 sent %.1f MiB (tc), all uplinks %.1f MiB, CPU busy %s %%' \
        "$label" "$H_WALL" "$(calc "$H_UP0 / 1048576")" "$(calc "$H_UP / 1048576")" "$H_CPU")"
}

# rmi_nodes IMAGE...: remove the images from both nodes' daemons.
rmi_nodes() {
    local i
    for i in 1 2; do dk "$i" rmi "$@" >>"$RUN/rmi.log" 2>&1 || die "docker rmi $* on host $i failed: $(tail -n2 "$RUN/rmi.log" | tr '\n' ' ')"; done
}

# ---------------------------------------------------------------- xfer ----

KEY=$RUN/cluster.key
APID=()
start_agents() {
    local i k
    "$XFER" keygen --out "$KEY" >/dev/null
    for i in 1 2; do
        rm -rf "$RUN/root$i"
        mkdir -p "$RUN/root$i"
        DOCKER_HOST=${SOCK[i]} ip netns exec "${NS[i]}" "$XFER" serve --listen "${IP[i]}:$PORT" --root "$RUN/root$i" \
            --key "$KEY" --container-engine docker >"$RUN/agent-$i.out" 2>"$RUN/agent-$i.err" &
        APID[i]=$!
        track "${APID[i]}"
    done
    for i in 1 2; do
        for ((k = 0; k < 150; k++)); do
            if grep -q 'xfer agent listening' "$RUN/agent-$i.out"; then break; fi
            kill -0 "${APID[i]}" 2>/dev/null || die "agent on host $i exited at start: $(tail -n3 "$RUN/agent-$i.err" | tr '\n' ' ')"
            sleep 0.1
        done
        grep -q 'xfer agent listening' "$RUN/agent-$i.out" || die "agent on host $i did not report listening within 15 s (see $RUN/agent-$i.err)"
    done
}

# xfer_push LABEL IMAGE ID: one `xfer image push` from host 0. Sets X_WALL,
# X_JSON, X_UP0, X_UP, X_CPU; returns 1 (with a note) when it failed.
xfer_push() {
    local label=$1 img=$2 id=$3 t0 t1 c0 c1 u0 u1 a0 a1 rc=0 i
    X_JSON=$RUN/push-$label.json
    c0=$(cpu_busy)
    u0=$("$NC" bytes 0 eth0)
    a0=$(all_up)
    t0=$EPOCHREALTIME
    # In the background and waited for, so a TERM or INT reaches the trap at once.
    DOCKER_HOST=$SOCK0 XDG_CACHE_HOME=$RUN/cache ip netns exec "${NS[0]}" timeout -s INT "$TIMEOUT" \
        "$XFER" image push "$img" --to "${IP[1]}:$PORT,${IP[2]}:$PORT" --key "$KEY" --json --cache "$RUN/image-cache" \
        >"$X_JSON" 2>"$RUN/push-$label.err" &
    local ppid=$!
    track "$ppid"
    wait "$ppid" || rc=$?
    untrack "$ppid"
    t1=$EPOCHREALTIME
    c1=$(cpu_busy)
    u1=$("$NC" bytes 0 eth0)
    a1=$(all_up)
    X_WALL=$(elapsed "$t0" "$t1")
    X_UP0=$((u1 - u0))
    X_UP=$((a1 - a0))
    X_CPU=$(busy_pct "$c0" "$c1")
    if [ "$rc" != 0 ]; then
        local why
        why=$(jq -r '.nodes[]? | select(.ok | not) | "\(.node): \(.error)"' "$X_JSON" 2>/dev/null | head -n 3 | tr '\n' ' ' || true)
        [ "$rc" != 124 ] || why="no result after ${TIMEOUT}s $why"
        note "$label: xfer image push exited $rc: ${why:-$(tail -n 3 "$RUN/push-$label.err" | tr '\n' ' ')}"
        return 1
    fi
    jq -e . "$X_JSON" >/dev/null 2>&1 || {
        note "$label: xfer image push printed no JSON (see $RUN/push-$label.err)"
        return 1
    }
    local ok
    ok=$(jq -r '[.nodes[].ok] | all' "$X_JSON")
    [ "$ok" = true ] || {
        note "$label: a node failed: $(jq -c '[.nodes[] | select(.ok | not) | {node, error}]' "$X_JSON")"
        return 1
    }
    for i in 1 2; do
        local got
        got=$(img_id "$i" "$img")
        if [ "$got" != "$id" ]; then
            note "$label: host $i holds $img as $got, the source as $id (JSON says $(jq -r ".nodes[$((i - 1))].id" "$X_JSON"))"
            return 1
        fi
    done
    log "$(printf '%-16s %7.2f s  (JSON duration %.2f s: save %s, push %s, load %s)  bytes_sent %.1f MiB, host 0 sent %.1f MiB (tc), all uplinks %.1f MiB, CPU busy %s %%' \
        "$label" "$X_WALL" "$(jq -r .duration_s "$X_JSON")" "$(jq -r '.save_s // "?"' "$X_JSON")" "$(jq -r '.push_s // "?"' "$X_JSON")" \
        "$(jq -r '.load_s // "?"' "$X_JSON")" "$(calc "$(jq -r .bytes_sent "$X_JSON") / 1048576")" \
        "$(calc "$X_UP0 / 1048576")" "$(calc "$X_UP / 1048576")" "$X_CPU")"
}

declare -A R=()
jget() { jq -r "$2 // \"n/a\"" "$1" 2>/dev/null || echo n/a; }

log "xfer $GIT_REV, $(nproc) cores, kernel $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg); floor S/B $(fmt %.2f "$FLOOR1") s, by hand in turn 2 S/B $(fmt %.2f "$(calc "2 * $FLOOR1")") s"

# ---- A: first delivery
byhand "A-byhand" "$IMG1" "$ID1"
R[a_h]=$H_WALL R[a_h_up0]=$H_UP0 R[a_h_up]=$H_UP R[a_h_cpu]=$H_CPU
rmi_nodes "$IMG1"
for i in 1 2; do
    [ -z "$(dk "$i" images -aq)" ] || die "host $i still holds images after docker rmi: $(dk "$i" images -a --format '{{.Repository}}:{{.Tag}} {{.ID}}' | tr '\n' ' ')"
done
sync
R[a_x]=n/a R[b_x]=n/a
if [ "$HAVE_XFER" = 1 ]; then
    start_agents
    if xfer_push "A-xfer" "$IMG1" "$ID1"; then
        R[a_x]=$X_WALL R[a_x_up0]=$X_UP0 R[a_x_up]=$X_UP R[a_x_cpu]=$X_CPU
        R[a_x_sent]=$(jget "$X_JSON" .bytes_sent) R[a_x_total]=$(jget "$X_JSON" .bytes_total)
        R[a_x_dur]=$(jget "$X_JSON" .duration_s)
        R[a_x_phases]="save $(jget "$X_JSON" .save_s) s, push $(jget "$X_JSON" .push_s) s, load $(jget "$X_JSON" .load_s) s"
    fi
else
    # Without xfer the nodes need xt/app:1 for B's "already hold the base".
    log "no xfer: loading $IMG1 into the nodes by hand again for B"
    byhand "A-byhand-again" "$IMG1" "$ID1"
fi
sync

# ---- B: re-delivery with a new top layer
for i in 1 2; do
    [ "$(img_id "$i" "$IMG1")" = "$ID1" ] || die "B needs $IMG1 on host $i, and it is not there"
done
byhand "B-byhand" "$IMG2" "$ID2"
R[b_h]=$H_WALL R[b_h_up0]=$H_UP0 R[b_h_up]=$H_UP R[b_h_cpu]=$H_CPU
if [ "$HAVE_XFER" = 1 ] && [ "${R[a_x]}" != n/a ]; then
    rmi_nodes "$IMG2"
    for i in 1 2; do
        [ "$(img_id "$i" "$IMG1")" = "$ID1" ] || die "docker rmi $IMG2 took $IMG1 along on host $i"
    done
    sync
    if xfer_push "B-xfer" "$IMG2" "$ID2"; then
        R[b_x]=$X_WALL R[b_x_up0]=$X_UP0 R[b_x_up]=$X_UP R[b_x_cpu]=$X_CPU
        R[b_x_sent]=$(jget "$X_JSON" .bytes_sent) R[b_x_total]=$(jget "$X_JSON" .bytes_total)
        R[b_x_skipped]=$(jget "$X_JSON" .bytes_skipped)
        R[b_x_dur]=$(jget "$X_JSON" .duration_s)
        R[b_x_phases]="save $(jget "$X_JSON" .save_s) s, push $(jget "$X_JSON" .push_s) s, load $(jget "$X_JSON" .load_s) s"
        R[b_x_blobs]=$(jq -r '[.blobs[]? | select(.bytes_sent > 0) | "\(.digest[7:19]) \(.size) B"] | join(", ")' "$X_JSON" 2>/dev/null || echo n/a)
    fi
fi
for i in "${APID[@]}"; do stop_pid "$i"; done
for i in 1 2; do
    if [ -f "$RUN/agent-$i.err" ] && grep -Eq ' (WARN|ERROR) ' "$RUN/agent-$i.err"; then
        note "agent $i logged: $(grep -E ' (WARN|ERROR) ' "$RUN/agent-$i.err" | head -n 3 | tr '\n' ' ')"
    fi
done

# ---- correctness: every node holds both images under the source's ids
CHECK=ok
for i in 1 2; do
    for pair in "$IMG1 $ID1" "$IMG2 $ID2"; do
        read -r img id <<<"$pair"
        got=$(img_id "$i" "$img")
        if [ "$got" != "$id" ]; then
            CHECK=FAILED
            note "host $i: $img is $got, the source's is $id"
        fi
    done
done

# ---------------------------------------------------------------- report ----

mibs() { if [[ $1 == n/a || -z $1 ]]; then echo n/a; else calc "$1 / 1048576" | awk '{ printf "%.1f MiB", $1 }'; fi; }
xs() { if [[ $1 == n/a || -z $1 ]]; then echo n/a; else awk -v a="$1" -v s="$2" 'BEGIN { printf "%.2f", a / s }'; fi; }
{
    echo
    echo "== xfer image push vs docker save | docker load: xfer $GIT_REV, $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ) =="
    echo "link: every host $LINK_MBIT Mbit/s each way (tc tbf rate ${LINK_MBIT}mbit burst ${TBF_BURST:-256kb} latency ${TBF_LATENCY:-50ms}, MTU ${MTU:-1500}), B = $LINE_RATE B/s; 2 nodes"
    echo "image $IMG1: base $BASE_MIB MiB + top $TOP_MIB MiB random, $LAYERS1 layers, docker save tar S = $S1 B ($(mibs "$S1")); $IMG2: same base, new top, S = $S2 B"
    echo "floor S/B = $(fmt %.2f "$FLOOR1") s (each node downloads S); by hand in turn sends 2 S from host 0: 2 S/B = $(fmt %.2f "$(calc "2 * $FLOOR1")") s"
    echo "first delivery: xfer $(fmt %.2f "${R[a_x]}") s, docker save|load $(fmt %.2f "${R[a_h]}") s, ratio $(ratio "${R[a_h]}" "${R[a_x]}")"
    echo "  by hand: host 0 sent $(mibs "${R[a_h_up0]}") (tc; 2 S = $(mibs $((2 * S1)))), $(xs "${R[a_h]}" "$FLOOR1") x S/B, CPU busy ${R[a_h_cpu]} %"
    if [ "${R[a_x]}" != n/a ]; then
        echo "  xfer:    bytes_sent $(mibs "${R[a_x_sent]}") of bytes_total $(mibs "${R[a_x_total]}") per node, host 0 sent $(mibs "${R[a_x_up0]}") (tc), all uplinks $(mibs "${R[a_x_up]}"), $(xs "${R[a_x]}" "$FLOOR1") x S/B, CPU busy ${R[a_x_cpu]} %; JSON duration ${R[a_x_dur]} s (${R[a_x_phases]})"
    fi
    echo "re-delivery (new top layer): xfer $(fmt %.2f "${R[b_x]}") s, docker save|load $(fmt %.2f "${R[b_h]}") s, ratio $(ratio "${R[b_h]}" "${R[b_x]}")"
    echo "  by hand: host 0 sent $(mibs "${R[b_h_up0]}") (tc; docker load receives the whole tar, 2 S = $(mibs $((2 * S2)))), CPU busy ${R[b_h_cpu]} %"
    if [ "${R[b_x]}" != n/a ]; then
        echo "  xfer:    bytes_sent $(mibs "${R[b_x_sent]}") (skipped $(mibs "${R[b_x_skipped]}")), host 0 sent $(mibs "${R[b_x_up0]}") (tc), all uplinks $(mibs "${R[b_x_up]}"), CPU busy ${R[b_x_cpu]} %; JSON duration ${R[b_x_dur]} s (${R[b_x_phases]}); blobs sent: ${R[b_x_blobs]}"
        echo "  bytes sent by host 0, by hand / xfer: $(mibs "${R[b_h_up0]}") / $(mibs "${R[b_x_up0]}"), ratio $(ratio "${R[b_h_up0]}" "${R[b_x_up0]}")"
    fi
    echo "check: both nodes hold $IMG1 = ${ID1:7:12} and $IMG2 = ${ID2:7:12} (docker image inspect): $CHECK"
    if [ ${#PROBLEMS[@]} -gt 0 ]; then
        echo "Problems seen:"
        printf -- '- %s\n' "${PROBLEMS[@]}"
    fi
} | tee "$BENCH_DIR/summary-$(date -u +%Y%m%dT%H%M%SZ).txt"
[ "$CHECK" = ok ] || exit 1
