#!/usr/bin/env bash
# Registry benchmark (issue 35): an image in a registry reaching N nodes,
# three ways side by side in one run, over tc-shaped links
# (scripts/netcluster.sh), each host with a Docker daemon of its own
# (scripts/dockerd.sh):
#
#   pulls   every node runs `docker pull` from the registry, all at once
#   push    host 1 runs `docker pull`, then `xfer image push` from host 1's
#           engine to every node (host 1 included: it holds it already)
#   xfer    `xfer image pull` on host 1 to every node: host 1 fetches each
#           blob once and streams each layer through the swarm while it
#           downloads (host 1's own agent from host 1's puller alone)
#
#   scripts/bench-image-pull.sh            (root; ~10 min for 1 GiB)
#
# Host 0 runs the registry (Debian's docker-registry, CNCF distribution 2.8,
# plain HTTP; its link shaped like the nodes': "a registry behind a link as
# slow as one node's") and the daemon that builds the image (busybox plus a
# BASE_MIB MiB base layer of random bytes and a TOP_MIB MiB top layer,
# scripts/dockerd.sh images), which skopeo pushes into the registry (gzip
# layers, as registries hold them). Hosts 1..N each run a daemon (with the
# registry as an insecure registry) and an agent (`xfer serve
# --container-engine docker`). Every node starts each path empty.
#
# Reported per path: wall seconds until every node holds the image (same id
# everywhere, checked), registry egress (the bytes host 0 sent on its link,
# by tc: headers included, about 3 % at MTU 1500) as a multiple of the
# image (the compressed blobs' total, I), and the ratio to xfer's time. The floors (issue 35): xfer's
# egress <= 1.05 x I; xfer's time <= 1.2 x (I over the registry link + the
# slowest node's load, from xfer's JSON); xfer faster than the parallel
# pulls.
#
# Env (defaults in brackets): N [4], BASE_MIB [900], TOP_MIB [100],
# LINK_MBIT [500] (every host link, both ways), BENCH_DIR
# [/var/tmp/xfer-bench-image-pull], PREFIX [xfip], KEEP_RUN [0],
# XFER [unset: build release].

set -euo pipefail
shopt -s inherit_errexit
export LC_ALL=C

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPT_DIR/.." && pwd)
LOG_TAG=bench-image-pull
# shellcheck source=scripts/lib-bench.sh
source "$SCRIPT_DIR/lib-bench.sh"
# shellcheck source=scripts/dockerd.sh
source "$SCRIPT_DIR/dockerd.sh"

N=${N:-4}
BASE_MIB=${BASE_MIB:-900}
TOP_MIB=${TOP_MIB:-100}
LINK_MBIT=${LINK_MBIT:-500}
BENCH_DIR=${BENCH_DIR:-/var/tmp/xfer-bench-image-pull}
KEEP_RUN=${KEEP_RUN:-0}
PORT=7470
REG_PORT=5000
export PREFIX=${PREFIX:-xfip}
NC=$SCRIPT_DIR/netcluster.sh
RUN=$BENCH_DIR/run
IMG=xt/app:1

[ "$(id -u)" = 0 ] || die "run as root (network namespaces, dockerd, apt-get)"
for v in N BASE_MIB TOP_MIB LINK_MBIT; do
    [[ ${!v} =~ ^[0-9]+$ && ${!v} -ge 1 ]] || die "$v must be a positive integer"
done
need jq jq
need tc iproute2
need timeout coreutils
dockerd_install
mkdir -p "$BENCH_DIR"
exec 9>"$BENCH_DIR/.lock"
flock -n 9 || die "another run holds $BENCH_DIR/.lock"

CLUSTER_UP=0
DAEMONS=()
REG_PID=""
cleanup() {
    local rc=$?
    set +e
    trap - EXIT INT TERM
    stop_all
    [ -z "$REG_PID" ] || kill "$REG_PID" 2>/dev/null
    local d
    for d in "${DAEMONS[@]}"; do dockerd_stop "$d"; done
    if [ "$CLUSTER_UP" = 1 ]; then "$NC" down; fi
    if [ "$rc" != 0 ]; then log "FAILED (exit $rc); logs kept in $RUN"; elif [ "$KEEP_RUN" != 1 ]; then rm -rf "$RUN"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
for d in "$RUN"/d[0-9]*; do [ ! -d "$d" ] || dockerd_stop "$d"; done
rm -rf "$RUN"
mkdir -p "$RUN"

if [ -n "${XFER:-}" ]; then
    cp "$XFER" "$RUN/xfer"
else
    log "building xfer (release)"
    (cd "$REPO" && cargo build --release -p xfer >&2) || die "cargo build --release -p xfer failed"
    cp "${CARGO_TARGET_DIR:-$REPO/target}/release/xfer" "$RUN/xfer"
fi
XFER=$RUN/xfer

CLUSTER_UP=1
log "cluster: host 0 (registry) and nodes 1..$N, $LINK_MBIT Mbit/s per link"
MGMT_NET=10.78.0 ROOT_ATTACH=0 "$NC" up "$N" "$LINK_MBIT"
NS=()
IP=()
for ((i = 0; i <= N; i++)); do
    NS[i]="$PREFIX-h$i"
    IP[i]=$("$NC" ip "$i")
done
REG=${IP[0]}:$REG_PORT
SOCK=()
for ((i = 0; i <= N; i++)); do
    DAEMONS+=("$RUN/d$i")
    mkdir -p "$RUN/d$i"
    echo "{\"insecure-registries\": [\"$REG\"]}" >"$RUN/d$i/daemon.json"
    SOCK[i]=$(dockerd_start "$RUN/d$i" "${NS[i]}")
done
dk() { # dk HOST ARGS...
    local h=$1
    shift
    DOCKER_HOST=${SOCK[h]} docker "$@"
}
XT_STANDIN=0 dockerd_images "${SOCK[0]}" "$BASE_MIB" "$TOP_MIB" >"$RUN/images.txt"

# The registry, in host 0, and the image pushed into it (gzip layers).
registry_up "${NS[0]}" "$REG" "$RUN/registry"
log "pushing $IMG into the registry (skopeo, gzip)"
ip netns exec "${NS[0]}" skopeo copy --quiet --src-daemon-host "${SOCK[0]}" --dest-tls-verify=false \
    "docker-daemon:$IMG" "docker://$REG/$IMG"
REF=$REG/$IMG
ID=$(dk 0 image inspect --format '{{.Id}}' "$IMG")
I=$(ip netns exec "${NS[0]}" curl -sf -H 'accept: application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json' \
    "http://$REG/v2/xt/app/manifests/1" | jq '[.config.size] + [.layers[].size] | add')
LINE_RATE=$((LINK_MBIT * 1000000 / 8))
log "$REF: $I bytes in the registry, id $ID; I over the registry link $(fmt %.1f "$(calc "$I / $LINE_RATE")") s"

# Bytes host 0 (the registry's host) has sent on its link so far, by tc:
# the registry's egress, headers included (the access log is written as
# each answer ends, too late to read right after a path).
egress() { "$NC" bytes 0 eth0; }
check_ids() { # check_ids NAME LABEL: every node holds NAME as the image's id
    local i got
    for ((i = 1; i <= N; i++)); do
        got=$(dk "$i" image inspect --format '{{.Id}}' "$1" 2>/dev/null || echo none)
        [ "$got" = "$ID" ] || die "$2: host $i holds $1 as $got, not $ID"
    done
}
empty_nodes() {
    local i
    for ((i = 1; i <= N; i++)); do
        dk "$i" rmi -f "$REF" >/dev/null 2>&1 || true
        dk "$i" image prune -af >/dev/null 2>&1 || true
    done
}

KEY=$RUN/cluster.key
"$XFER" keygen --out "$KEY" >/dev/null
start_agents() {
    local i k
    stop_all || true # the agents of the path before (their exit status is 143)
    PIDS=()
    for ((i = 1; i <= N; i++)); do
        rm -rf "$RUN/root$i"
        mkdir -p "$RUN/root$i"
        DOCKER_HOST=${SOCK[i]} ip netns exec "${NS[i]}" "$XFER" serve --listen "${IP[i]}:$PORT" --root "$RUN/root$i" \
            --key "$KEY" --container-engine docker >"$RUN/agent-$i.out" 2>"$RUN/agent-$i.err" &
        track $!
    done
    for ((i = 1; i <= N; i++)); do
        for ((k = 0; k < 150; k++)); do
            grep -q 'xfer agent listening' "$RUN/agent-$i.out" 2>/dev/null && break
            sleep 0.1
        done
    done
}
TO=$(for ((i = 1; i <= N; i++)); do printf '%s:%s,' "${IP[i]}" "$PORT"; done)
TO=${TO%,}

declare -A T E IDLE
# ------------------------------------------------------------ pulls ----
empty_nodes
e0=$(egress)
c0=$(cpu_idle_total)
t0=$EPOCHREALTIME
pids=()
for ((i = 1; i <= N; i++)); do
    dk "$i" pull -q "$REF" >"$RUN/pull-$i.out" 2>&1 &
    pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || die "a docker pull failed: $(cat "$RUN"/pull-*.out | tail -n3)"; done
T[pulls]=$(elapsed "$t0" "$EPOCHREALTIME")
IDLE[pulls]=$(idle_since "$c0")
E[pulls]=$(($(egress) - e0))
check_ids "$REF" pulls
log "$N parallel docker pulls: $(fmt %.1f "${T[pulls]}") s, registry sent $(fmt %.2f "$(calc "${E[pulls]} / $I")") x I"

# ------------------------------------------------------------- push ----
empty_nodes
start_agents
e0=$(egress)
c0=$(cpu_idle_total)
t0=$EPOCHREALTIME
dk 1 pull -q "$REF" >"$RUN/push-pull.out" 2>&1 || die "docker pull on host 1 failed"
DOCKER_HOST=${SOCK[1]} ip netns exec "${NS[1]}" "$XFER" image push "$REF" --to "$TO" --key "$KEY" --json \
    --cache "$RUN/push-cache" >"$RUN/push.json" 2>"$RUN/push.err" || die "xfer image push failed: $(tail -n3 "$RUN/push.err")"
T[push]=$(elapsed "$t0" "$EPOCHREALTIME")
IDLE[push]=$(idle_since "$c0")
E[push]=$(($(egress) - e0))
check_ids "$REF" push
log "docker pull on host 1 + xfer image push: $(fmt %.1f "${T[push]}") s, registry sent $(fmt %.2f "$(calc "${E[push]} / $I")") x I"

# ------------------------------------------------------------- xfer ----
empty_nodes
start_agents
e0=$(egress)
c0=$(cpu_idle_total)
t0=$EPOCHREALTIME
ip netns exec "${NS[1]}" "$XFER" image pull "$REF" --insecure --to "$TO" --key "$KEY" --json \
    --cache "$RUN/pull-cache" >"$RUN/xfer.json" 2>"$RUN/xfer.err" || die "xfer image pull failed: $(tail -n3 "$RUN/xfer.err")"
T[xfer]=$(elapsed "$t0" "$EPOCHREALTIME")
IDLE[xfer]=$(idle_since "$c0")
E[xfer]=$(($(egress) - e0))
check_ids "$REF" xfer
LOAD=$(jq '[.nodes[].load_s] | max' "$RUN/xfer.json")
IDEAL=$(calc "$I / $LINE_RATE + $LOAD")
log "xfer image pull: $(fmt %.1f "${T[xfer]}") s, registry sent $(fmt %.2f "$(calc "${E[xfer]} / $I")") x I"

echo
echo "| path | time s | registry egress x I | time / xfer's | CPU idle % |"
echo "|---|---|---|---|---|"
for p in pulls push xfer; do
    case $p in
    pulls) name="$N x docker pull, at once" ;;
    push) name="docker pull on one node + xfer image push" ;;
    xfer) name="xfer image pull" ;;
    esac
    echo "| $name | $(fmt %.1f "${T[$p]}") | $(fmt %.2f "$(calc "${E[$p]} / $I")") | $(fmt %.2f "$(calc "${T[$p]} / ${T[xfer]}")") | ${IDLE[$p]} |"
done
echo
echo "I = $I bytes (the registry's blobs), $N nodes, $LINK_MBIT Mbit/s links; ideal = I over the registry link + the slowest load ($(fmt %.1f "$LOAD") s) = $(fmt %.1f "$IDEAL") s."
echo "Floors: egress $(fmt %.2f "$(calc "${E[xfer]} / $I")") (<= 1.05); time $(fmt %.2f "$(calc "${T[xfer]} / $IDEAL")") x the ideal (<= 1.2); pulls / xfer $(fmt %.2f "$(calc "${T[pulls]} / ${T[xfer]}")") (> 1)."
