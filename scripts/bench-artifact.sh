#!/usr/bin/env bash
# Model artifact benchmark (issue 35): a CNCF ModelPack artifact in a
# registry reaching N nodes, two ways side by side in one run, over
# tc-shaped links (scripts/netcluster.sh):
#
#   whole    `xfer pull oci://REF --local-dir DIR --to NODES` on node 1:
#            the artifact fetched whole into DIR, then pushed as a folder
#   stream   `xfer sync oci://REF --from n1 --wait`: node 1's agent
#            fetches each layer once and streams its weight layers to the
#            other nodes while they download, then delivers the rest
#
#   scripts/bench-artifact.sh            (root; ~3 min for 512 MiB)
#
# Host 0 runs the registry (Debian's docker-registry, plain HTTP, its link
# shaped like the nodes': a registry behind a link as slow as one node's),
# into which tests/oci_push.py pushes the artifact as `modctl push` would:
# a config layer and LAYERS raw weight layers of LAYER_MIB MiB of random
# bytes each. Hosts 1..N each run an agent; every path starts with empty
# roots. Reported per path: wall seconds until every node holds the model
# (the same root everywhere, checked), registry egress by tc as a multiple
# of the artifact (S), and the ratio to the ideal, S over the registry
# link (the stream can end no sooner; the fan-out overlaps it).
#
# Env (defaults in brackets): N [3], LAYERS [2], LAYER_MIB [256],
# LINK_MBIT [500] (every host link, both ways), BENCH_DIR
# [/var/tmp/xfer-bench-artifact], PREFIX [xfar], KEEP_RUN [0], XFER [unset:
# build release].

set -euo pipefail
shopt -s inherit_errexit
export LC_ALL=C

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPT_DIR/.." && pwd)
LOG_TAG=bench-artifact
# shellcheck source=scripts/lib-bench.sh
source "$SCRIPT_DIR/lib-bench.sh"

N=${N:-3}
LAYERS=${LAYERS:-2}
LAYER_MIB=${LAYER_MIB:-256}
LINK_MBIT=${LINK_MBIT:-500}
BENCH_DIR=${BENCH_DIR:-/var/tmp/xfer-bench-artifact}
KEEP_RUN=${KEEP_RUN:-0}
PORT=7470
REG_PORT=5000
export PREFIX=${PREFIX:-xfar}
NC=$SCRIPT_DIR/netcluster.sh
RUN=$BENCH_DIR/run

[ "$(id -u)" = 0 ] || die "run as root (network namespaces)"
for v in N LAYERS LAYER_MIB LINK_MBIT; do
    [[ ${!v} =~ ^[0-9]+$ && ${!v} -ge 1 ]] || die "$v must be a positive integer"
done
[ "$N" -ge 2 ] || die "N must be at least 2 (node 1 pulls, the others receive)"
need jq jq
need tc iproute2
command -v docker-registry >/dev/null || die "docker-registry is missing: apt-get install docker-registry"
mkdir -p "$BENCH_DIR"
exec 9>"$BENCH_DIR/.lock"
flock -n 9 || die "another run holds $BENCH_DIR/.lock"

CLUSTER_UP=0
REG_PID=""
cleanup() {
    local rc=$?
    set +e
    trap - EXIT INT TERM
    stop_all
    [ -z "$REG_PID" ] || kill "$REG_PID" 2>/dev/null
    if [ "$CLUSTER_UP" = 1 ]; then "$NC" down; fi
    if [ "$rc" != 0 ]; then log "FAILED (exit $rc); logs kept in $RUN"; elif [ "$KEEP_RUN" != 1 ]; then rm -rf "$RUN"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
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
export MGMT_NET=10.77.0
ROOT_ATTACH=0 "$NC" up "$N" "$LINK_MBIT"
NS=()
IP=()
for ((i = 0; i <= N; i++)); do
    NS[i]="$PREFIX-h$i"
    IP[i]=$("$NC" ip "$i")
done
REG=${IP[0]}:$REG_PORT

# The registry, in host 0, and the artifact pushed into it.
registry_up "${NS[0]}" "$REG" "$RUN/registry"
mkdir -p "$RUN/src"
echo '{"architectures": ["LlamaForCausalLM"]}' >"$RUN/src/config.json"
spec="[{\"media\": \"application/vnd.cncf.model.weight.config.v1.raw\", \"path\": \"config.json\", \"file\": \"$RUN/src/config.json\"}"
for ((l = 1; l <= LAYERS; l++)); do
    f=$RUN/src/model-$l.safetensors
    head -c "$((LAYER_MIB << 20))" /dev/urandom >"$f"
    spec+=", {\"media\": \"application/vnd.cncf.model.weight.v1.raw\", \"path\": \"model-$l.safetensors\", \"file\": \"$f\"}"
done
echo "$spec]" >"$RUN/spec.json"
log "pushing the artifact ($LAYERS x $LAYER_MIB MiB) into the registry (tests/oci_push.py)"
ip netns exec "${NS[0]}" python3 "$REPO/tests/oci_push.py" "$REG" bench/model v1 "$RUN/spec.json" >/dev/null
rm -f "$RUN"/src/model-*.safetensors
REF=$REG/bench/model:v1
S=$(ip netns exec "${NS[0]}" curl -sf -H 'accept: application/vnd.oci.image.manifest.v1+json' \
    "http://$REG/v2/bench/model/manifests/v1" | jq '[.layers[].size] | add')
LINE_RATE=$((LINK_MBIT * 1000000 / 8))
IDEAL=$(calc "$S / $LINE_RATE")
log "$REF: S = $S bytes; S over the registry link $(fmt %.1f "$IDEAL") s"

egress() { "$NC" bytes 0 eth0; }

KEY=$RUN/cluster.key
"$XFER" keygen --out "$KEY" >/dev/null
CF=$RUN/cluster.toml
{
    echo "key = \"$KEY\""
    for ((i = 1; i <= N; i++)); do
        printf '\n[[node]]\nname = "n%s"\nagent = "%s:%s"\nroot = "%s"\n' "$i" "${IP[i]}" "$PORT" "$RUN/root$i"
    done
} >"$CF"
start_agents() {
    local i k
    stop_all || true # the agents of the path before (their exit status is 143)
    PIDS=()
    for ((i = 1; i <= N; i++)); do
        rm -rf "$RUN/root$i"
        mkdir -p "$RUN/root$i"
        ip netns exec "${NS[i]}" "$XFER" serve --listen "${IP[i]}:$PORT" --root "$RUN/root$i" \
            --key "$KEY" >"$RUN/agent-$i.out" 2>"$RUN/agent-$i.err" &
        track $!
    done
    for ((i = 1; i <= N; i++)); do
        for ((k = 0; k < 150; k++)); do
            grep -q 'xfer agent listening' "$RUN/agent-$i.out" 2>/dev/null && break
            sleep 0.1
        done
    done
}
# The root every node reports for the model (one line per node).
roots() {
    ip netns exec "${NS[1]}" "$XFER" status --cluster "$CF" --json 2>/dev/null |
        jq -r --arg m "$1" '.[] | [.status.models[]? | select(.name == $m and .state == "complete") | .root] | first // "none"'
}
TO=$(for ((i = 2; i <= N; i++)); do printf '%s:%s,' "${IP[i]}" "$PORT"; done)
TO=${TO%,}

declare -A T E IDLE
# ------------------------------------------------------------ whole ----
start_agents
e0=$(egress)
c0=$(cpu_idle_total)
t0=$EPOCHREALTIME
ip netns exec "${NS[1]}" env XDG_CACHE_HOME="$RUN/cache" "$XFER" pull "oci://$REF" --insecure --json \
    --local-dir "$RUN/root1/model" --to "$TO" --key "$KEY" >"$RUN/whole.json" 2>"$RUN/whole.err" ||
    die "xfer pull oci:// --to failed: $(tail -n3 "$RUN/whole.err")"
T[whole]=$(elapsed "$t0" "$EPOCHREALTIME")
IDLE[whole]=$(idle_since "$c0")
E[whole]=$(($(egress) - e0))
[ "$(jq '[.push.nodes[] | select(.ok)] | length' "$RUN/whole.json")" = "$((N - 1))" ] || die "whole: not every node holds the model"
log "xfer pull oci:// --local-dir --to: $(fmt %.1f "${T[whole]}") s, registry sent $(fmt %.2f "$(calc "${E[whole]} / $S")") x S"

# ----------------------------------------------------------- stream ----
start_agents
nodes=$(for ((i = 1; i <= N; i++)); do printf 'n%s,' "$i"; done)
e0=$(egress)
c0=$(cpu_idle_total)
t0=$EPOCHREALTIME
ip netns exec "${NS[1]}" "$XFER" sync "oci://$REF" --insecure --cluster "$CF" --from n1 --nodes "${nodes%,}" --wait --json \
    >"$RUN/stream.out" 2>"$RUN/stream.err" || die "xfer sync oci:// failed: $(tail -n3 "$RUN/stream.err")"
t1=$EPOCHREALTIME
T[stream]=$(elapsed "$t0" "$t1")
IDLE[stream]=$(idle_since "$c0")
E[stream]=$(($(egress) - e0))
[ "$(roots model | sort -u | grep -cv none)" = 1 ] && ! roots model | grep -q none ||
    die "stream: the nodes do not hold one complete root: $(roots model | tr '\n' ' ')"
log "xfer sync oci://: $(fmt %.1f "${T[stream]}") s, registry sent $(fmt %.2f "$(calc "${E[stream]} / $S")") x S"
# Where the streamed job's seconds went (`--wait --json`'s timeline: the
# command's hand-over and the moment it saw the end, and the source's
# marks of the round: the download, the stream, the round after it).
read -r handed dl streamed done_s seen < <(jq -r '.timeline | [.handed_s, .round.downloaded_s, .round.streamed_s, .round.done_s, .seen_s] | @tsv' "$RUN/stream.out")
PARTS="the job's parts: hand-over $(fmt %.2f "$handed") s; the download $(fmt %.2f "$dl") s and the stream $(fmt %.2f "$streamed") s from the round's start (the registry link's floor with headers, ${E[stream]} bytes by tc: $(fmt %.2f "$(calc "${E[stream]} / $S * $IDEAL")") s); the round after it $(fmt %.2f "$(calc "$done_s - $streamed")") s; --wait seeing the end $(fmt %.2f "$(calc "$seen - $handed - $done_s")") s"
log "$PARTS"

echo
echo "| path | time s | x ideal | registry egress x S | CPU idle % |"
echo "|---|---|---|---|---|"
for p in whole stream; do
    case $p in
    whole) name="xfer pull oci:// --local-dir --to (fetch, then push)" ;;
    stream) name="xfer sync oci:// (streamed while it downloads)" ;;
    esac
    echo "| $name | $(fmt %.1f "${T[$p]}") | $(fmt %.2f "$(calc "${T[$p]} / $IDEAL")") | $(fmt %.2f "$(calc "${E[$p]} / $S")") | ${IDLE[$p]} |"
done
echo
[ -z "${PARTS:-}" ] || echo "Streamed, $PARTS."
echo "S = $S bytes ($LAYERS weight layers of $LAYER_MIB MiB and a config), $N nodes, $LINK_MBIT Mbit/s links; ideal = S over the registry link = $(fmt %.1f "$IDEAL") s; fetch-then-push / streamed = $(fmt %.2f "$(calc "${T[whole]} / ${T[stream]}")")."
