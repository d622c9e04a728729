#!/usr/bin/env bash
# From nothing to serving (issue 34's bench): the seed's way by hand against
# xfer's one command, with and without the loader plugin, side by side in
# one run, each measured from empty nodes to the model's first completion.
#
#   sudo scripts/bench-day.sh                 # RUNS=3 deaf rounds + 1 answering
#   sudo RUNS=1 ANSWERING=0 scripts/bench-day.sh   # a smoke run (~5 min)
#
# Setup: two namespace nodes (scripts/launchnet.sh, PREFIX xbd, management
# 10.93.i.0/24 holding the default route, fabric 10.94.0.i shaped to
# FABRIC_MBIT by a token bucket on each node's fabric NIC), one real `xfer
# serve` agent per node in its own mount namespace (the node's root at one
# path on both nodes), a Hub look-alike (tests/hub_server.py) in the head's
# namespace with each connection's file bodies capped at CDN_MBIT, serving a
# random-weight Llama of MODEL_MIB MiB (scripts/tiny_llama.py --mib: float32,
# shards of at most 64 MiB with an index, made once into BENCH_DIR), and
# real vLLM (the CPU build of scripts/engines.sh, which this installs with
# the loader plugin) at tensor parallelism 2, one rank per node.
#
# Resolvers: a round is `deaf` (each node's resolv.conf names a fabric
# address nobody owns, with glibc's defaults, timeout:5 attempts:2, and its
# hosts file lacks the fabric addresses: an air-gapped fabric whose DNS is
# unreachable) or `answering` (launchnet.sh's: a name server that refuses at
# once). RUNS deaf rounds come first, then ANSWERING answering rounds.
#
# Every path of every round starts from nothing: the agents are stopped, both
# nodes' roots emptied, the agents started again. Paths, in an order that
# rotates from round to round (load from elsewhere hits all alike):
#   alone    `xfer sync hf://ORG/NAME@REV --nodes n1 --wait`: the download
#            onto the head alone, nothing fanned out (the "download" of the
#            ideal; the best this Hub's per-connection cap allows xfer).
#   by hand  the seed's way: `hf download --local-dir` on the head (8
#            workers, huggingface_hub's default), then `rsync -a` over the
#            fabric to an rsync daemon on the other node (no ssh: its cipher
#            would only cost the seed more on 2 cores), then both ranks of
#            `xfer-launch plan` started by hand at once (nsenter into the
#            agents' mount and network namespaces, so the path resolves),
#            /health polled every 250 ms, one 1-token completion. Columns:
#            hf, rsync, engine (the last: start to completion, with the
#            weights present and in the page cache: the engine's own start).
#   deploy   `xfer-launch deploy --json` (preflight, sync of the Hub repo to
#            both nodes, `up`: ranks, gate, /health, 1- and 32-token
#            completions). Columns: check (with its rounds: ports, then
#            facts beside reach, then the verdict), sync, up (its JSON's phases); the total ends at the
#            model's first answer (its one-token completion, `answered_unix`),
#            as the by-hand path's does, and `exited` says when deploy exited
#            after its 32-token measure.
#   plugin   the same with `stream_weights = true` (`--load-format xfer`).
# Each row also gives `load` (vLLM's "Loading weights took", the slowest
# rank) and CPU idle % over the path (/proc/stat; the host has few cores
# shared with other work, so a low idle means the figures are slowed).
#
# The ideal and the floors (issue 34; reported, never asserted):
#   ideal    = max(alone, S/B) + engine           (S bytes, B = FABRIC_MBIT)
#   ideal+p  = max(alone, S/B, engine - load) + load x (largest shard / S)
#   floor    deploy <= ideal + 5 s; plugin <= ideal+p + 5 s
# printed as seconds over each ideal ("over"); the engine's own start is too
# noisy here for a ratio. The engine and load of a round are its by-hand
# path's, so a round without a by-hand path has no ideal.
#
# Env [default]: RUNS [3] deaf rounds, ANSWERING [1] answering rounds,
# MODEL_MIB [272] (>= 256: 287 MB in 5 shards), CDN_MBIT [40], FABRIC_MBIT
# [400], DEAF_TIMEOUT [5] and DEAF_ATTEMPTS [2] (the deaf resolv.conf),
# UP_TIMEOUT [600] (deploy --timeout), PATHS ["alone hand deploy plugin"],
# PREFIX [xbd], BENCH_DIR [/var/tmp/xfer-bench-day] (the model, kept),
# SKIP_BUILD [0] (1: take target/release as it is; else `cargo build
# --release -p xfer -p launcher`), KEEP_RUN [0] (1: keep the scratch
# folder with every log). Output: per-round Markdown rows as each round
# ends, then the whole table and medians on stdout.
# Runtime: ~3.5-4.5 min a round on 2 shared cores (vLLM's own start, ~40 s
# a path, dominates), ~15 min at the defaults, plus the release build.
# Needs root, python3, curl, jq, nsenter, nft, tc, rsync.

set -euo pipefail
shopt -s inherit_errexit
export LC_ALL=C

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPT_DIR/.." && pwd)
SELF=$SCRIPT_DIR/$(basename "${BASH_SOURCE[0]}")
LOG_TAG=bench-day
# shellcheck source=scripts/lib-bench.sh
source "$SCRIPT_DIR/lib-bench.sh"

usage() { sed -n '2,68p' "$SELF" | sed 's/^# \{0,1\}//'; }
case ${1:-} in
"") ;;
-h | --help | help)
    usage
    exit 0
    ;;
*)
    usage >&2
    exit 2
    ;;
esac

[ "$(id -u)" = 0 ] || die "run as root (network namespaces, mounts, tc)"

RUNS=${RUNS:-3}
ANSWERING=${ANSWERING:-1}
MODEL_MIB=${MODEL_MIB:-272}
CDN_MBIT=${CDN_MBIT:-40}
FABRIC_MBIT=${FABRIC_MBIT:-400}
DEAF_TIMEOUT=${DEAF_TIMEOUT:-5}
DEAF_ATTEMPTS=${DEAF_ATTEMPTS:-2}
UP_TIMEOUT=${UP_TIMEOUT:-600}
PATHS=${PATHS:-alone hand deploy plugin}
export PREFIX=${PREFIX:-xbd}
export MGMT_NET=${MGMT_NET:-10.93} FABRIC_NET=${FABRIC_NET:-10.94.0}
BENCH_DIR=${BENCH_DIR:-/var/tmp/xfer-bench-day}
SKIP_BUILD=${SKIP_BUILD:-0}
KEEP_RUN=${KEEP_RUN:-0}
for v in MODEL_MIB CDN_MBIT FABRIC_MBIT DEAF_TIMEOUT DEAF_ATTEMPTS UP_TIMEOUT; do
    posint "${!v}" || die "$v must be a positive integer (got '${!v}')"
done
for v in RUNS ANSWERING; do
    [[ ${!v} =~ ^[0-9]+$ ]] || die "$v must be a whole number (got '${!v}')"
done
((RUNS + ANSWERING >= 1)) || die "RUNS + ANSWERING must be at least 1"
for p in $PATHS; do
    case $p in alone | hand | deploy | plugin) ;; *) die "PATHS: $p is not alone, hand, deploy or plugin" ;; esac
done
((MODEL_MIB >= 256)) || log "warning: MODEL_MIB=$MODEL_MIB is under issue 34's 256 MB"

for t in python3 curl jq nsenter nft ip tc unshare mount rsync column; do
    command -v "$t" >/dev/null 2>&1 || die "$t is not installed"
done

NET=$SCRIPT_DIR/launchnet.sh
AGENT_PORT=7470
RSYNC_PORT=8730
API=http://$MGMT_NET.1.2:8000 # the head's API, through its management NIC
ORG_NAME=bench/llama-${MODEL_MIB}m

"$SCRIPT_DIR/engines.sh" install || die "cannot install the real engines and the loader plugin (scripts/engines.sh install)"
PY=$("$SCRIPT_DIR/engines.sh" python)
VENV=$(dirname "$(dirname "$PY")")
VLLM_VERSION=$("$PY" -c 'import vllm.version as v; print(v.__version__)' 2>/dev/null || echo unknown)

# ---------------------------------------------------------------- setup ----

TMP=$(mktemp -d /tmp/xfer-bench-day.XXXXXX)
MNT=$TMP/mnt # where every agent sees its node's root
KEY=$TMP/cluster.key
NET_UP=0
AGENTS=()
HUB_PID=
RSYNCD_PID=
MARK=xfer-bench-day-$$ # in every rank's environment, to find strays

# marked_pids: processes whose environment carries MARK (ranks we started,
# and what they forked, even once orphaned).
marked_pids() {
    grep -lzxs -- "BENCH_DAY_MARK=$MARK" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3 || true
}
kill_marked() {
    local pids k
    for ((k = 0; k < 20; k++)); do
        mapfile -t pids < <(marked_pids)
        [ ${#pids[@]} -gt 0 ] || return 0
        if ((k < 10)); then kill -TERM "${pids[@]}" 2>/dev/null || true; else kill -KILL "${pids[@]}" 2>/dev/null || true; fi
        sleep 0.2
    done
}

cleanup() {
    local rc=$?
    set +e
    trap - EXIT INT TERM
    stop_all
    kill_marked
    if [ "$NET_UP" = 1 ]; then "$NET" down; fi
    if [ "$KEEP_RUN" = 1 ] || [ "$rc" != 0 ]; then log "scratch kept in $TMP"; else rm -rf "$TMP"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

mkdir -p "$MNT" "$TMP/bin" "$BENCH_DIR"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$REPO/target}
if [ "$SKIP_BUILD" != 1 ]; then
    log "building xfer and xfer-launch (release)"
    (cd "$REPO" && cargo build --release -p xfer -p launcher >&2)
fi
for b in xfer xfer-launch; do
    [ -x "$CARGO_TARGET_DIR/release/$b" ] || die "no $CARGO_TARGET_DIR/release/$b (unset SKIP_BUILD)"
    cp "$CARGO_TARGET_DIR/release/$b" "$TMP/bin/$b"
done
XFER=$TMP/bin/xfer
XL=$TMP/bin/xfer-launch
"$XFER" keygen --out "$KEY" >/dev/null
export XDG_STATE_HOME=$TMP/state XDG_CACHE_HOME=$TMP/cache
unset RUST_LOG

# The model, as a Hub repo folder (made once).
HUB_REPOS=$BENCH_DIR/repos
MODEL_SRC=$HUB_REPOS/$ORG_NAME
if [ ! -f "$MODEL_SRC/model.safetensors.index.json" ]; then
    log "making a random Llama of >= $MODEL_MIB MiB in $MODEL_SRC (once)"
    "$SCRIPT_DIR/engines.sh" model "$MODEL_SRC" --mib "$MODEL_MIB" >&2 ||
        die "cannot make the model (scripts/engines.sh model $MODEL_SRC --mib $MODEL_MIB)"
fi
S=$(tree_bytes "$MODEL_SRC")
SHARDS=$(find "$MODEL_SRC" -name '*.safetensors' | wc -l)
SHARD_MAX=$(find "$MODEL_SRC" -name '*.safetensors' -printf '%s\n' | sort -n | tail -n1)
SHARD_SUM=$(find "$MODEL_SRC" -name '*.safetensors' -printf '%s\n' | awk '{ s += $1 } END { printf "%.0f\n", s }')
S_OVER_B=$(calc "$S * 8 / ($FABRIC_MBIT * 1000000)")
log "model $ORG_NAME: $(calc "$S / 1e6") MB in $SHARDS shards (largest $(calc "$SHARD_MAX / 1e6") MB); S/B = $(fmt %.2f "$S_OVER_B") s at $FABRIC_MBIT Mbit/s"

# ---------------------------------------------------------------- cluster ----

fabric_if() { if (($1 % 2)); then echo fab0; else echo enp1s0f1; fi; }
ns() { echo "$PREFIX-n$1"; }

log "two nodes (PREFIX $PREFIX, management $MGMT_NET.i.0/24, fabric $FABRIC_NET.0/24 at $FABRIC_MBIT Mbit/s)"
NET_UP=1
"$NET" up 2 >&2 || die "launchnet.sh up 2 failed (is another cluster on $MGMT_NET/$FABRIC_NET up? set MGMT_NET/FABRIC_NET)"
for i in 1 2; do
    ip netns exec "$(ns "$i")" tc qdisc replace dev "$(fabric_if "$i")" root tbf \
        rate "${FABRIC_MBIT}mbit" burst 256kb latency 50ms
done
ANSWERING_RESOLV=$(cat "/etc/netns/$(ns 1)/resolv.conf")

# set_resolver MODE: deaf or answering, for processes entering the nodes
# from now on (`ip netns exec` mounts /etc/netns/NODE/* over /etc/*).
set_resolver() {
    local i etc hosts
    for i in 1 2; do
        etc=/etc/netns/$(ns "$i")
        if [ "$1" = deaf ]; then
            printf 'nameserver %s.250\noptions timeout:%s attempts:%s\n' "$FABRIC_NET" "$DEAF_TIMEOUT" "$DEAF_ATTEMPTS" >"$etc/resolv.conf"
            # The machine's hosts file without the fabric addresses, naming
            # the host (so only the fabric addresses are left to the resolver).
            hosts=$(grep -vE "^[[:space:]]*${FABRIC_NET//./\\.}\\.[0-9]+[[:space:]]" /etc/hosts || true)
            if ! awk -v h="$(hostname)" '$1 !~ /^#/ { for (k = 2; k <= NF; k++) if ($k == h) f = 1 } END { exit !f }' <<<"$hosts"; then
                hosts+=$'\n'"127.0.1.1 $(hostname)"
            fi
            printf '%s\n' "$hosts" >"$etc/hosts"
        else
            printf '%s\n' "$ANSWERING_RESOLV" >"$etc/resolv.conf"
            rm -f "$etc/hosts"
        fi
    done
}

# The Hub look-alike, in the head's namespace on its management address
# (where its agent and `hf download` reach it, and so does `deploy`'s
# listing from this machine, the operator's), each connection's bodies
# capped.
CDN_RATE=$((CDN_MBIT * 125000))
HUB_HOST=$MGMT_NET.1.2
ip netns exec "$(ns 1)" python3 -u "$REPO/tests/hub_server.py" --repos "$HUB_REPOS" --host "$HUB_HOST" --rate "$CDN_RATE" \
    >"$TMP/hub.out" 2>"$TMP/hub.err" </dev/null &
HUB_PID=$!
track "$HUB_PID"
HUB_PORT=$(hub_port "$TMP/hub" "$HUB_PID")
export HF_ENDPOINT=http://$HUB_HOST:$HUB_PORT
COMMIT=$(ip netns exec "$(ns 1)" curl -sf "$HF_ENDPOINT/api/models/$ORG_NAME" | jq -r .sha)
[[ $COMMIT =~ ^[0-9a-f]{40}$ ]] || die "the Hub look-alike gave no commit for $ORG_NAME"

# The by-hand copy's receiving end: an rsync daemon on node 2's fabric
# address, writing into node 2's root.
cat >"$TMP/rsyncd.conf" <<EOF
use chroot = false
reverse lookup = false
pid file = $TMP/rsyncd.pid
[node]
path = $TMP/node2
read only = false
uid = root
gid = root
EOF
ip netns exec "$(ns 2)" rsync --daemon --no-detach --config "$TMP/rsyncd.conf" --address "$FABRIC_NET.2" --port "$RSYNC_PORT" \
    >"$TMP/rsyncd.out" 2>&1 </dev/null &
RSYNCD_PID=$!
track "$RSYNCD_PID"

# start_agent I: `xfer serve` in node I, in a mount namespace where the
# node's own root is bind-mounted at $MNT; its PATH has `xfer` (the loader
# plugin asks it) and the engines' venv.
start_agent() {
    local i=$1 out=$TMP/agent$1.out k pid
    mkdir -p "$TMP/node$i"
    : >"$out"
    PATH=$TMP/bin:$VENV/bin:$PATH XDG_CACHE_HOME=$TMP/cache-n$i \
        ip netns exec "$(ns "$i")" unshare --mount --propagation private sh -c \
        "mount --bind '$TMP/node$i' '$MNT' && exec '$XFER' serve --allow-launch --listen 0.0.0.0:$AGENT_PORT --root '$MNT' --key '$KEY' --verify-every 0" \
        >"$out" 2>>"$TMP/agent$i.log" </dev/null &
    pid=$!
    track "$pid"
    AGENTS+=("$pid")
    for ((k = 0; k < 150; k++)); do
        if grep -q 'listening' "$out"; then return 0; fi
        kill -0 "$pid" 2>/dev/null || die "agent $i exited at start: $(tail -n3 "$TMP/agent$i.log")"
        sleep 0.1
    done
    die "agent $i did not report listening within 15 s"
}

# fresh_nodes MODE: agents stopped, both roots emptied, the resolver set,
# agents started: every path starts from nothing, with no vLLM cache
# either (each node's XDG_CACHE_HOME, its ranks' and its agent's, is
# emptied too: vLLM caches what it learns of a model class there, 8 s of a
# cold start here; the by-hand ranks once used the host's warm
# ~/.cache while the agents' ranks started cold).
fresh_nodes() {
    local p
    for p in "${AGENTS[@]}"; do stop_pid "$p"; done
    AGENTS=()
    kill_marked
    rm -rf "$TMP/node1" "$TMP/node2" "$TMP/cache-n1" "$TMP/cache-n2"
    set_resolver "$1"
    start_agent 1
    start_agent 2
}

# write_config FILE MODEL [STREAM]: a cluster file (nodes by management
# address, fabric per node), vLLM TP 2 on the CPU build.
write_config() {
    local i
    {
        echo "key = \"$KEY\""
        for i in 1 2; do
            printf '\n[[node]]\nname = "n%d"\nagent = "%s.%d.2:%d"\nroot = "%s"\nfabric_if = "%s"\nfabric_ip = "%s.%d"\n' \
                "$i" "$MGMT_NET" "$i" "$AGENT_PORT" "$MNT" "$(fabric_if "$i")" "$FABRIC_NET" "$i"
        done
        printf '\n[launch]\nengine = "vllm"\nmodel = "%s"\ntp = 2\npp = 1\n' "$2"
        if [ "${3:-}" = stream ]; then echo "stream_weights = true"; fi
        printf 'extra_args = ["--dtype", "float32", "--max-model-len", "256", "--enforce-eager"]\n'
        printf '\n[launch.env]\nVLLM_CPU_KVCACHE_SPACE = "1"\nVLLM_CPU_OMP_THREADS_BIND = "nobind"\nOMP_NUM_THREADS = "1"\nBENCH_DAY_MARK = "%s"\n' "$MARK"
    } >"$1"
}
CF_HAND=$TMP/hand.toml
CF_DEPLOY=$TMP/deploy.toml
CF_PLUGIN=$TMP/plugin.toml
write_config "$CF_HAND" "$MNT/hand"
write_config "$CF_DEPLOY" "$ORG_NAME@$COMMIT"
write_config "$CF_PLUGIN" "$ORG_NAME@$COMMIT" stream

# The by-hand rank command lines, from the plan (read before any clock):
# RANKCMD_r = nsenter into the agent of the rank's node, env -i with PATH
# and the plan's env, the plan's argv.
read_hand_plan() {
    local r node idx plan=$TMP/hand-plan.json
    "$XL" plan --cluster "$CF_HAND" --json >"$plan" 2>"$TMP/plan.err" ||
        die "xfer-launch plan failed: $(tail -n3 "$TMP/plan.err")"
    [ "$(jq '.ranks | length' "$plan")" = 2 ] || die "the plan does not have 2 ranks"
    HAND_MODEL=$(jq -r '.model' "$plan")
    for r in 0 1; do
        [ "$(jq --argjson r "$r" '.ranks[$r].pre | length' "$plan")" = 0 ] ||
            die "rank $r has pre commands; the by-hand launch here runs argv only"
        node=$(jq -r --argjson r "$r" '.ranks[$r].node' "$plan")
        idx=${node#n}
        mapfile -d '' -t "RANKCMD_$r" < <(
            printf '%s\0' nsenter -t "${AGENTS[idx - 1]}" -m -n env -i \
                "PATH=$VENV/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
                "XDG_CACHE_HOME=$TMP/cache-n$idx"
            jq -j --argjson r "$r" '.ranks[$r] | ([.env | to_entries[] | "\(.key)=\(.value)"] + .argv)[] | (., "\u0000")' "$plan"
        )
    done
}

# ---------------------------------------------------------------- measurements ----

PROBLEMS=()
note() {
    log "PROBLEM: $*"
    PROBLEMS+=("$*")
}
health_code() { curl -s -o /dev/null -w '%{http_code}' --max-time 1 "$API/health" || true; }
wait_api_gone() {
    local k
    for ((k = 0; k < 100; k++)); do
        [ "$(health_code)" = 000 ] && return 0
        sleep 0.1
    done
    note "the API at $API still answers after the ranks were stopped"
}
# load_of LOG...: the slowest "Loading weights took X seconds" in the logs.
load_of() {
    local v
    v=$(grep -hoE 'Loading weights took [0-9.]+ seconds' "$@" 2>/dev/null | awk '{ print $4 }' | sort -g | tail -n1)
    echo "${v:-n/a}"
}

# Each path sets T (total seconds, n/a on failure), PARTS (its phases, as
# text), LOAD and IDLE.

path_alone() { # TAG
    local t0 cpu rc=0
    cpu=$(cpu_idle_total)
    t0=$EPOCHREALTIME
    "$XFER" sync --cluster "$CF_DEPLOY" "hf://$ORG_NAME@$COMMIT" --nodes n1 --wait >"$TMP/$1.out" 2>&1 || rc=$?
    T=$(elapsed "$t0" "$EPOCHREALTIME")
    IDLE=$(idle_since "$cpu")
    LOAD=n/a
    PARTS="pull onto n1 alone"
    if [ "$rc" != 0 ]; then
        note "$1: xfer sync --nodes n1 exited $rc: $(tail -n2 "$TMP/$1.out" | tr '\n' ' ')"
        T=n/a
    fi
}

rank_running() {
    local stat state ppid
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    read -r state ppid _ <<<"${stat##*) }"
    [ "$ppid" = "$$" ] && [ "$state" != Z ]
}

path_hand() { # TAG
    local tag=$1 t0 t1 t2 t3 cpu r k ok=0 deadline pid body
    local -a pids=()
    HF_S=n/a RSYNC_S=n/a ENGINE_S=n/a LOAD=n/a T=n/a
    read_hand_plan
    cpu=$(cpu_idle_total)
    t0=$EPOCHREALTIME
    if ! ip netns exec "$(ns 1)" env HF_HUB_DISABLE_TELEMETRY=1 HF_HUB_DISABLE_PROGRESS_BARS=1 HF_HOME="$TMP/hf-home" \
        "$VENV/bin/hf" download "$ORG_NAME" --revision "$COMMIT" --local-dir "$TMP/node1/hand" >"$TMP/$tag-hf.out" 2>&1; then
        note "$tag: hf download failed: $(tail -n2 "$TMP/$tag-hf.out" | tr '\n' ' ')"
        IDLE=$(idle_since "$cpu")
        PARTS="hf download failed"
        return
    fi
    t1=$EPOCHREALTIME
    mkdir -p "$TMP/node2"
    if ! ip netns exec "$(ns 1)" rsync -a --exclude .cache "$TMP/node1/hand" "rsync://$FABRIC_NET.2:$RSYNC_PORT/node/" >"$TMP/$tag-rsync.out" 2>&1; then
        note "$tag: rsync failed: $(tail -n2 "$TMP/$tag-rsync.out" | tr '\n' ' ')"
        IDLE=$(idle_since "$cpu")
        PARTS="rsync failed"
        return
    fi
    t2=$EPOCHREALTIME
    for r in 0 1; do
        local -n cmd=RANKCMD_$r
        # A session (and process group) of its own: vLLM's workers rename
        # themselves over their environment (VLLM::Worker_TP1 shows no
        # MARK), so the group is what finds them all at the end.
        BENCH_DAY_MARK=$MARK setsid "${cmd[@]}" >"$TMP/$tag-rank$r.log" 2>&1 </dev/null &
        pids+=("$!")
        track "$!"
        unset -n cmd
    done
    deadline=$((${t2%.*} + UP_TIMEOUT))
    while ((${EPOCHREALTIME%.*} < deadline)); do
        if [ "$(health_code)" = 200 ]; then
            ok=1
            break
        fi
        for pid in "${pids[@]}"; do
            if ! kill -0 "$pid" 2>/dev/null; then
                ok=2
                break 2
            fi
        done
        sleep 0.25
    done
    if [ "$ok" = 1 ]; then
        body=$(jq -cn --arg m "$HAND_MODEL" '{model: $m, prompt: "Hello", max_tokens: 1, temperature: 0}')
        if curl -sf --max-time 120 -H 'content-type: application/json' -d "$body" "$API/v1/completions" >"$TMP/$tag-completion.json"; then
            ok=3
        fi
    fi
    t3=$EPOCHREALTIME
    IDLE=$(idle_since "$cpu")
    for pid in "${pids[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do
        for ((k = 0; k < 50; k++)); do rank_running "$pid" || break; sleep 0.1; done
        if rank_running "$pid"; then kill -KILL "$pid" 2>/dev/null || true; fi
        wait "$pid" 2>/dev/null || true
        # Whatever the rank's group still holds (its workers).
        kill -KILL -- "-$pid" 2>/dev/null || true
        untrack "$pid"
    done
    kill_marked
    wait_api_gone
    HF_S=$(elapsed "$t0" "$t1") RSYNC_S=$(elapsed "$t1" "$t2")
    LOAD=$(load_of "$TMP/$tag"-rank*.log)
    case $ok in
    3)
        ENGINE_S=$(elapsed "$t2" "$t3")
        T=$(elapsed "$t0" "$t3")
        ;;
    2) note "$tag: a rank exited before /health answered: $(grep -hm2 -E 'Error|error' "$TMP/$tag"-rank*.log | tr '\n' ' ')" ;;
    1) note "$tag: /health answered 200 but the completion failed" ;;
    *) note "$tag: /health did not answer 200 within ${UP_TIMEOUT}s" ;;
    esac
    PARTS="hf $(fmt %.1f "$HF_S") + rsync $(fmt %.1f "$RSYNC_S") + engine $(fmt %.1f "$ENGINE_S")"
}

path_deploy() { # TAG CLUSTER-FILE
    local tag=$1 cf=$2 t0 cpu rc=0 v i
    cpu=$(cpu_idle_total)
    t0=$EPOCHREALTIME
    "$XL" deploy --cluster "$cf" --json --timeout "$UP_TIMEOUT" --grace 2 --record "$TMP/$tag.record.json" \
        >"$TMP/$tag.json" 2>"$TMP/$tag.err" || rc=$?
    T=$(elapsed "$t0" "$EPOCHREALTIME")
    IDLE=$(idle_since "$cpu")
    v=$TMP/$tag.json
    # The day ends when the model answers, as on the by-hand path (its
    # one-token completion), not when deploy exits after its 32-token
    # tokens-per-second measure: deploy's `answered_unix` on this clock.
    local answered exited
    answered=$(jq -r '.phases.answered_unix // empty' "$v" 2>/dev/null)
    exited=$T
    if [ -n "$answered" ]; then
        answered=$(awk -v a="$answered" -v t="$t0" 'BEGIN { printf "%.3f", a - t }')
        T=$answered
    fi
    # The sync runs beside the check (and, with the plugin, beside up).
    PARTS="check $(fmt %.1f "$(jq -r '.phases.check_s // "n/a"' "$v" 2>/dev/null)") [ports $(fmt %.1f "$(jq -r '.phases.check_rounds.ports_s // "n/a"' "$v" 2>/dev/null)"), facts $(fmt %.1f "$(jq -r '.phases.check_rounds.facts_s // "n/a"' "$v" 2>/dev/null)") || reach $(fmt %.1f "$(jq -r '.phases.check_rounds.reach_s // "n/a"' "$v" 2>/dev/null)"), verdict $(fmt %.1f "$(jq -r '.phases.check_rounds.conclude_s // "n/a"' "$v" 2>/dev/null)")] || sync $(fmt %.1f "$(jq -r '.phases.sync_s // "n/a"' "$v" 2>/dev/null)") + up $(fmt %.1f "$(jq -r '.phases.up_s // "n/a"' "$v" 2>/dev/null)"); answered $(fmt %.1f "${answered:-n/a}"), exited $(fmt %.1f "$exited")"
    # The ranks' logs, copied before the nodes are emptied.
    for i in 1 2; do
        cat "$TMP/node$i"/.xfer/runs/*/rank.log >"$TMP/$tag-rank$i.log" 2>/dev/null || true
    done
    LOAD=$(load_of "$TMP/$tag"-rank*.log)
    if [ "$rc" != 0 ] || [ "$(jq -r '.ready' "$v" 2>/dev/null)" != true ]; then
        note "$tag: xfer-launch deploy exited $rc: $(tail -n2 "$TMP/$tag.err" | tr '\n' ' ')"
        T=n/a
    fi
    "$XL" down --cluster "$cf" --grace 2 >"$TMP/$tag-down.out" 2>&1 || note "$tag: xfer-launch down failed: $(tail -n2 "$TMP/$tag-down.out" | tr '\n' ' ')"
    kill_marked
    wait_api_gone
}

# ---------------------------------------------------------------- run ----

GIT_REV=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
log "xfer $GIT_REV, vLLM $VLLM_VERSION, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); RUNS=$RUNS ANSWERING=$ANSWERING PATHS=\"$PATHS\""

ROWS=()
declare -A MED=() # "key" -> space-separated values over the deaf rounds
add() { MED[$1]+="${MED[$1]:+ }$2"; }
row() { # ROUND RESOLVER PATH TOTAL PARTS LOAD OVER IDLE
    local line
    line="| $1 | $2 | $3 | $(fmt %.1f "$4") | $5 | $(fmt %.1f "$6") | $7 | $8 |"
    ROWS+=("$line")
    echo "$line"
}
over() { # TOTAL IDEAL
    if [[ $1 == n/a || $2 == n/a ]]; then echo n/a; else fmt %+.1f "$(calc "$1 - $2")"; fi
}

read -r -a ORDER <<<"$PATHS"
total_rounds=$((RUNS + ANSWERING))
echo
echo "| round | resolver | path | total s | phases s | load s | over ideal s | CPU idle % |"
echo "|---|---|---|---|---|---|---|---|"
for ((round = 1; round <= total_rounds; round++)); do
    if ((round <= RUNS)); then mode=deaf; else mode=answering; fi
    declare -A RT=() RP=() RL=() RI=()
    HAND_ENGINE=n/a HAND_LOAD=n/a
    n=${#ORDER[@]}
    for ((k = 0; k < n; k++)); do
        p=${ORDER[(k + round - 1) % n]}
        tag=r$round-$p
        log "round $round ($mode): $p"
        fresh_nodes "$mode"
        case $p in
        alone) path_alone "$tag" ;;
        hand)
            path_hand "$tag"
            HAND_ENGINE=$ENGINE_S HAND_LOAD=$LOAD
            ;;
        deploy) path_deploy "$tag" "$CF_DEPLOY" ;;
        plugin) path_deploy "$tag" "$CF_PLUGIN" ;;
        esac
        RT[$p]=$T RP[$p]=$PARTS RL[$p]=$LOAD RI[$p]=$IDLE
        log "round $round ($mode): $p took $(fmt %.1f "$T") s ($PARTS), CPU idle $IDLE %"
    done
    # The ideals of this round.
    alone=${RT[alone]:-n/a}
    IDEAL=n/a IDEAL_P=n/a
    if [[ $alone != n/a && $HAND_ENGINE != n/a ]]; then
        dl=$(maxof "$alone" "$S_OVER_B")
        IDEAL=$(calc "$dl + $HAND_ENGINE")
        if [ "$HAND_LOAD" != n/a ]; then
            last=$(calc "$HAND_LOAD * $SHARD_MAX / $SHARD_SUM")
            IDEAL_P=$(calc "$(maxof "$dl" "$(calc "$HAND_ENGINE - $HAND_LOAD")") + $last")
        fi
    fi
    for p in hand deploy plugin; do
        [ -n "${RT[$p]:-}" ] || continue
        case $p in
        hand) name="by hand" o=$(over "${RT[$p]}" "$IDEAL") ;;
        deploy) name="xfer-launch deploy" o=$(over "${RT[$p]}" "$IDEAL") ;;
        plugin) name="deploy + plugin" o=$(over "${RT[$p]}" "$IDEAL_P") ;;
        esac
        row "$round" "$mode" "$name" "${RT[$p]}" "${RP[$p]}" "${RL[$p]}" "$o" "${RI[$p]}"
        if [ "$mode" = deaf ]; then
            [ "${RT[$p]}" = n/a ] || add "t_$p" "${RT[$p]}"
            [ "$o" = n/a ] || add "o_$p" "$o"
        fi
    done
    if [ -n "${RT[alone]:-}" ]; then
        row "$round" "$mode" "download alone" "${RT[alone]}" "xfer sync onto n1 alone; S/B $(fmt %.1f "$S_OVER_B")" n/a "" "${RI[alone]}"
    fi
    if [ "$IDEAL" != n/a ]; then
        row "$round" "$mode" "ideal" "$IDEAL" "max(alone $(fmt %.1f "$alone"), S/B $(fmt %.1f "$S_OVER_B")) + engine $(fmt %.1f "$HAND_ENGINE")" n/a "" ""
        [ "$mode" != deaf ] || add ideal "$IDEAL"
    fi
    if [ "$IDEAL_P" != n/a ]; then
        row "$round" "$mode" "ideal with plugin" "$IDEAL_P" "max(alone, S/B, engine - load $(fmt %.1f "$(calc "$HAND_ENGINE - $HAND_LOAD")")) + last shard $(fmt %.2f "$last")" n/a "" ""
        [ "$mode" != deaf ] || add ideal_p "$IDEAL_P"
    fi
    unset RT RP RL RI
done

# ---------------------------------------------------------------- report ----

med() { local -a a; read -r -a a <<<"${MED[$1]:-}"; median "${a[@]}"; }
{
    echo
    echo "== From nothing to serving: xfer $GIT_REV, vLLM $VLLM_VERSION (CPU, TP 2 over 2 nodes), $(nproc) host cores, $(date -u +%Y-%m-%dT%H:%MZ) =="
    echo "model $ORG_NAME: $(fmt %.1f "$(calc "$S / 1e6")") MB in $SHARDS shards; Hub look-alike capped at $CDN_MBIT Mbit/s a connection; fabric $FABRIC_MBIT Mbit/s (S/B $(fmt %.1f "$S_OVER_B") s); deaf resolver timeout:$DEAF_TIMEOUT attempts:$DEAF_ATTEMPTS"
    echo
    echo "| round | resolver | path | total s | phases s | load s | over ideal s | CPU idle % |"
    echo "|---|---|---|---|---|---|---|---|"
    printf '%s\n' "${ROWS[@]}"
    if ((RUNS > 0)); then
        echo
        echo "Medians of the $RUNS deaf round(s): by hand $(fmt %.1f "$(med t_hand)") s, deploy $(fmt %.1f "$(med t_deploy)") s ($(fmt %+.1f "$(med o_deploy)") over the ideal; floor +5), deploy + plugin $(fmt %.1f "$(med t_plugin)") s ($(fmt %+.1f "$(med o_plugin)") over its ideal; floor +5); ideal $(fmt %.1f "$(med ideal)") s, with the plugin $(fmt %.1f "$(med ideal_p)") s."
    fi
    if [ ${#PROBLEMS[@]} -gt 0 ]; then
        echo
        echo "Problems seen:"
        printf -- '- %s\n' "${PROBLEMS[@]}"
    fi
}
