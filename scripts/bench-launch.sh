#!/usr/bin/env bash
# What `xfer-launch` costs over launching the same plan by hand, side by side
# in one invocation, and how `xfer-launch check` scales with the node count.
#
#   sudo scripts/bench-launch.sh
#
# On a namespace cluster (scripts/launchnet.sh, PREFIX xbl: a management NIC
# per node that the host reaches, a fabric NIC the ranks meet over) with one
# real `xfer serve` agent per node, each in its own mount namespace so the
# model is at the same path on every node (as tests/launch.rs does), and the
# stand-in engine (tests/standin) playing vLLM, for every N in NODES and every
# engine load time L in LOADS (STANDIN_LOAD_SECS=L in [launch.env]), RUNS
# rounds of:
#   check    `xfer-launch check` wall time.
#   up       `xfer-launch up` wall time, start to exit on ready: its own check
#            (>= 3 s: the reach probe listens for its whole window), starting
#            the ranks through the agents, polling /health every 250 ms, a
#            1-token and a 32-token completion, the run record.
#   down     `xfer-launch down --grace 2` wall time after that up.
#   by hand  what a person's script does after reading `xfer-launch plan
#            --json` (read before the clock starts): start every rank at once
#            with `nsenter -t AGENT -m -n env -i PATH=.. PYTHONPATH=.. <plan
#            env> <plan argv>` (the agent's mount and network namespaces, so
#            the model path resolves), poll http://10.79.1.2:8000/health
#            every 250 ms until 200, one 1-token POST /v1/completions; then
#            the ranks are killed (not timed). The stand-in checks every rank
#            against the plan (STANDIN_PLAN) on both paths.
# Medians of the RUNS rounds are reported; the rounds interleave the four
# measurements so that load from elsewhere on the machine hits all alike.
#
# Reading the table: up/by-hand is the launcher's wall time as a multiple of
# the by-hand launch; it tends to 1 as the engine's own start (L) grows.
# overhead = up - by-hand in seconds: the launcher's fixed cost (mostly the
# preflight and its 3 s reach window, plus the agent round trips and the
# extra 32-token completion), which should not grow with L.
#
# ENGINE=vllm runs the same rounds with real vLLM (the CPU build of
# scripts/engines.sh, which this installs if missing) instead of the
# stand-in: tensor parallelism 2 over 2 nodes, the tiny random Llama of
# scripts/tiny_llama.py pushed to both; L does not apply. Its table adds
# the first completion's latency, on both paths (for `up`, the record's
# first_token_ms of its 1-token completion). Runtime: ~2 min a round.
#
# Env (defaults in brackets): ENGINE [standin], NODES ["2 4"; vllm: 2],
# LOADS ["0 10"; vllm: 0], RUNS [3],
# UP_TIMEOUT [60] (xfer-launch up --timeout), PREFIX [xbl] (namespace and
# nftables names, see launchnet.sh), SKIP_BUILD [0] (1: use the binaries in
# $CARGO_TARGET_DIR/release as they are), KEEP_RUN [0] (1: keep the scratch
# directory with every log). Runtime with the defaults: ~4-5 minutes.
# Needs root (network namespaces, mounts), python3, curl, jq, nsenter, nft.

set -euo pipefail
shopt -s inherit_errexit
export LC_ALL=C

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPT_DIR/.." && pwd)
SELF=$SCRIPT_DIR/$(basename "${BASH_SOURCE[0]}")
LOG_TAG=bench-launch
# shellcheck source=scripts/lib-bench.sh
source "$SCRIPT_DIR/lib-bench.sh"

usage() { sed -n '2,44p' "$SELF" | sed 's/^# \{0,1\}//'; }
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

[ "$(id -u)" = 0 ] || die "run as root (network namespaces, mounts)"

ENGINE=${ENGINE:-standin}
case $ENGINE in
standin)
    NODES=${NODES:-2 4}
    LOADS=${LOADS:-0 10}
    UP_TIMEOUT=${UP_TIMEOUT:-60}
    ENGINE_BIN=$REPO/tests/standin/bin
    ENGINE_PYPATH=$REPO/tests/standin/pylib
    ;;
vllm)
    NODES=${NODES:-2}
    LOADS=0
    UP_TIMEOUT=${UP_TIMEOUT:-300}
    "$SCRIPT_DIR/engines.sh" install || die "cannot install the real engines (scripts/engines.sh)"
    VENV=$(dirname "$(dirname "$("$SCRIPT_DIR/engines.sh" python)")")
    ENGINE_BIN=$VENV/bin
    ENGINE_PYPATH=
    ;;
*) die "ENGINE must be standin or vllm" ;;
esac
RUNS=${RUNS:-3}
export PREFIX=${PREFIX:-xbl}
SKIP_BUILD=${SKIP_BUILD:-0}
KEEP_RUN=${KEEP_RUN:-0}
for v in RUNS UP_TIMEOUT; do
    [[ ${!v} =~ ^[0-9]+$ && ${!v} -ge 1 ]] || die "$v must be a positive integer"
done
for n in $NODES; do [[ $n =~ ^[0-9]+$ && $n -ge 2 && $n -le 60 ]] || die "NODES: $n is not 2..60"; done
for l in $LOADS; do [[ $l =~ ^[0-9]+([.][0-9]+)?$ ]] || die "LOADS: $l is not a number of seconds"; done

NET=$SCRIPT_DIR/launchnet.sh
STANDIN=$REPO/tests/standin
AGENT_PORT=7470
API=http://10.79.1.2:8000 # the head's API, through its management NIC
MODEL_NAME=tiny

for t in python3 curl jq nsenter nft ip unshare mount pgrep; do
    command -v "$t" >/dev/null 2>&1 || die "$t is not installed"
done

# ---------------------------------------------------------------- setup ----

TMP=$(mktemp -d /tmp/xfer-bench-launch.XXXXXX)
MNT=$TMP/mnt      # where every agent sees its node's root
KEY=$TMP/cluster.key
CLUSTER=$TMP/cluster.toml
PLAN=$TMP/plan.json
NET_UP=0
AGENTS=()   # agent pid of node i at index i-1 (also the pid nsenter targets)
PROBLEMS=()
note() {
    log "PROBLEM: $*"
    PROBLEMS+=("$*")
}

cleanup() {
    local rc=$?
    set +e
    trap - EXIT INT TERM
    # Our children: agents (and, as their descendants, the ranks they
    # supervise) and any by-hand ranks still running.
    stop_all
    if [ "$NET_UP" = 1 ]; then "$NET" down; fi
    if [ "$KEEP_RUN" = 1 ]; then log "scratch kept in $TMP"; else rm -rf "$TMP"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

mkdir -p "$MNT"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$REPO/target}
if [ "$SKIP_BUILD" != 1 ]; then
    log "building the workspace (release)"
    (cd "$REPO" && cargo build --release --workspace >&2)
fi
# Private copies, so a rebuild elsewhere cannot swap a binary mid-run.
for b in xfer xfer-launch; do
    [ -x "$CARGO_TARGET_DIR/release/$b" ] || die "no $CARGO_TARGET_DIR/release/$b (unset SKIP_BUILD)"
    cp "$CARGO_TARGET_DIR/release/$b" "$TMP/$b"
done
XFER=$TMP/xfer
XL=$TMP/xfer-launch
"$XFER" keygen --out "$KEY" >/dev/null
export XDG_STATE_HOME=$TMP/state XDG_CACHE_HOME=$TMP/cache # run records, hash cache
unset RUST_LOG

# A small model folder with what engines look for (for real vLLM, the tiny
# random Llama).
SRC=$TMP/model-src
if [ "$ENGINE" = vllm ]; then
    "$SCRIPT_DIR/engines.sh" model "$SRC" >/dev/null 2>&1 || die "cannot make the tiny model (scripts/engines.sh model)"
else
    mkdir -p "$SRC"
    printf '{"architectures": ["BenchForCausalLM"]}\n' >"$SRC/config.json"
    head -c $((3 << 20)) /dev/urandom >"$SRC/model.safetensors"
fi

# ---------------------------------------------------------------- cluster ----

fabric_if() { if (($1 % 2)); then echo fab0; else echo enp1s0f1; fi; }

# start_agent I: `xfer serve` in node I, in a mount namespace where the
# node's own root is bind-mounted at $MNT, with the stand-in on its PATH.
start_agent() {
    local i=$1 out=$TMP/agent$1.out k pid
    mkdir -p "$TMP/node$i"
    : >"$out"
    # ip netns exec, unshare and sh all exec, so $! is the agent itself.
    PATH=$ENGINE_BIN:$PATH PYTHONPATH=$ENGINE_PYPATH \
        ip netns exec "$PREFIX-n$i" unshare --mount --propagation private sh -c \
        "mount --bind '$TMP/node$i' '$MNT' && exec '$XFER' serve --allow-launch --listen 0.0.0.0:$AGENT_PORT --root '$MNT' --key '$KEY' --verify-every 0" \
        >"$out" 2>"$TMP/agent$i.log" </dev/null &
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

stop_agents() {
    local p
    for p in "${AGENTS[@]}"; do stop_pid "$p"; done
    AGENTS=()
}

# cluster_up N: namespaces, N agents, the model pushed to every node.
cluster_up() {
    local n=$1 i to=()
    NET_UP=1
    "$NET" up "$n" >&2 || die "launchnet.sh up $n failed (is another cluster on 10.79/10.80 up?)"
    for ((i = 1; i <= n; i++)); do
        rm -rf "$TMP/node$i"
        start_agent "$i"
        to+=("10.79.$i.2:$AGENT_PORT")
    done
    local IFS=,
    "$XFER" push "$SRC" --name "$MODEL_NAME" --key "$KEY" --to "${to[*]}" >"$TMP/push.out" 2>&1 ||
        die "push to the nodes failed: $(tail -n3 "$TMP/push.out")"
}

cluster_down() {
    stop_agents
    "$NET" down
    NET_UP=0
}

# write_config N L: the cluster file (nodes by management address, fabric
# lines per node), the plan of it, and the by-hand rank command lines.
write_config() {
    local n=$1 load=$2 i
    {
        echo "key = \"$KEY\""
        for ((i = 1; i <= n; i++)); do
            printf '\n[[node]]\nname = "n%d"\nagent = "10.79.%d.2:%d"\nroot = "%s"\nfabric_if = "%s"\nfabric_ip = "10.80.0.%d"\n' \
                "$i" "$i" "$AGENT_PORT" "$MNT" "$(fabric_if "$i")" "$i"
        done
        printf '\n[launch]\nengine = "vllm"\nmodel = "%s/%s"\n' "$MNT" "$MODEL_NAME"
        if [ "$ENGINE" = vllm ]; then
            printf 'tp = 2\npp = %d\nextra_args = ["--dtype", "float32", "--max-model-len", "256", "--enforce-eager"]\n' $((n / 2))
            printf '\n[launch.env]\nVLLM_CPU_KVCACHE_SPACE = "1"\nVLLM_CPU_OMP_THREADS_BIND = "nobind"\nOMP_NUM_THREADS = "1"\n'
        else
            printf '\n[launch.env]\nSTANDIN_PLAN = "%s"\nSTANDIN_LOAD_SECS = "%s"\n' "$PLAN" "$load"
        fi
    } >"$CLUSTER"
    "$XL" plan --cluster "$CLUSTER" --json >"$PLAN" 2>"$TMP/plan.err" ||
        die "xfer-launch plan failed: $(tail -n3 "$TMP/plan.err")"
    read_plan "$n"
}

# read_plan N: what the by-hand script takes from the plan, per rank r:
# RANKCMD_r, the whole command line (nsenter into the agent of the rank's
# node, env -i with PATH, PYTHONPATH, the agents' XDG_CACHE_HOME (so both
# paths share vLLM's cache) and the plan's env, the plan's argv).
# MODEL_PATH: the model name the API serves.
read_plan() {
    local n=$1 r node idx
    [ "$(jq '.ranks | length' "$PLAN")" = "$n" ] || die "the plan does not have $n ranks"
    MODEL_PATH=$(jq -r '.model' "$PLAN")
    for ((r = 0; r < n; r++)); do
        [ "$(jq --argjson r "$r" '.ranks[$r].pre | length' "$PLAN")" = 0 ] ||
            die "rank $r has pre commands; the by-hand launch here runs argv only"
        node=$(jq -r --argjson r "$r" '.ranks[$r].node' "$PLAN")
        idx=${node#n}
        mapfile -d '' -t "RANKCMD_$r" < <(
            printf '%s\0' nsenter -t "${AGENTS[idx - 1]}" -m -n env -i \
                "PATH=$ENGINE_BIN:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
                "PYTHONPATH=$ENGINE_PYPATH" "XDG_CACHE_HOME=$XDG_CACHE_HOME"
            jq -j --argjson r "$r" '.ranks[$r] | ([.env | to_entries[] | "\(.key)=\(.value)"] + .argv)[] | (., "\u0000")' "$PLAN"
        )
    done
}

# ---------------------------------------------------------------- measurements ----

# Each sets SECS (wall seconds) and returns non-zero on failure (with a note).

time_check() { # TAG
    local t0 rc=0
    t0=$EPOCHREALTIME
    "$XL" check --cluster "$CLUSTER" >"$TMP/$1.out" 2>&1 || rc=$?
    SECS=$(elapsed "$t0" "$EPOCHREALTIME")
    if [ "$rc" != 0 ]; then
        note "$1: xfer-launch check exited $rc: $(grep -E '^FAIL' "$TMP/$1.out" | head -n2 | tr '\n' ' ')"
        return 1
    fi
}

time_up() { # TAG; also sets READY_S, the record's time_to_ready_s
    local t0 rc=0
    t0=$EPOCHREALTIME
    "$XL" up --cluster "$CLUSTER" --timeout "$UP_TIMEOUT" --grace 2 --record "$TMP/$1.json" >"$TMP/$1.out" 2>&1 || rc=$?
    SECS=$(elapsed "$t0" "$EPOCHREALTIME")
    READY_S=$(jq -r '.time_to_ready_s // "n/a"' "$TMP/$1.json" 2>/dev/null || echo n/a)
    FIRST_S=$(jq -r '(.readiness.first_token_ms // empty) / 1000' "$TMP/$1.json" 2>/dev/null || echo n/a)
    [ -n "$FIRST_S" ] || FIRST_S=n/a
    if [ "$rc" != 0 ]; then
        note "$1: xfer-launch up exited $rc: $(tail -n2 "$TMP/$1.out" | tr '\n' ' ')"
        return 1
    fi
}

time_down() { # TAG
    local t0 rc=0
    t0=$EPOCHREALTIME
    "$XL" down --cluster "$CLUSTER" --grace 2 >"$TMP/$1.out" 2>&1 || rc=$?
    SECS=$(elapsed "$t0" "$EPOCHREALTIME")
    if [ "$rc" != 0 ]; then
        note "$1: xfer-launch down exited $rc: $(tail -n2 "$TMP/$1.out" | tr '\n' ' ')"
        return 1
    fi
}

# rank_running PID: PID is still our child and not a zombie. (lib-bench's
# our_child reads /proc/PID/stat after testing for it, which races with
# ranks that exit on their own once a peer is gone.)
rank_running() {
    local stat state ppid
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    read -r state ppid _ <<<"${stat##*) }"
    [ "$ppid" = "$$" ] && [ "$state" != Z ]
}

# stop_ranks PID...: SIGTERM to every by-hand rank at once, SIGKILL to any
# left after 2 s, then reap them.
stop_ranks() {
    local p k left
    kill -TERM "$@" 2>/dev/null || true
    for ((k = 0; k < 20; k++)); do
        left=0
        for p; do if rank_running "$p"; then left=1; fi; done
        [ "$left" = 1 ] || break
        sleep 0.1
    done
    for p; do
        if rank_running "$p"; then kill -KILL "$p" 2>/dev/null || true; fi
        wait "$p" 2>/dev/null || true
        untrack "$p"
    done
}

health_code() { curl -s -o /dev/null -w '%{http_code}' --max-time 1 "$API/health" || true; }

# time_by_hand TAG N: every rank at once, /health every 250 ms, one 1-token
# completion; the ranks are stopped afterwards (not timed).
time_by_hand() {
    local tag=$1 n=$2 r t0 ok=0 deadline pid
    local -a pids=()
    t0=$EPOCHREALTIME
    for ((r = 0; r < n; r++)); do
        local -n cmd=RANKCMD_$r
        "${cmd[@]}" >"$TMP/$tag-rank$r.log" 2>&1 </dev/null &
        pids+=("$!")
        track "$!"
        unset -n cmd
    done
    deadline=$((${t0%.*} + UP_TIMEOUT))
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
        local body t1
        body=$(jq -cn --arg m "$MODEL_PATH" '{model: $m, prompt: "Hello", max_tokens: 1, temperature: 0}')
        t1=$EPOCHREALTIME
        if curl -sf --max-time 120 -H 'content-type: application/json' -d "$body" "$API/v1/completions" >"$TMP/$tag-completion.json"; then
            ok=3
            HAND_FIRST_S=$(elapsed "$t1" "$EPOCHREALTIME")
        fi
    fi
    SECS=$(elapsed "$t0" "$EPOCHREALTIME")
    stop_ranks "${pids[@]}"
    case $ok in
    3) return 0 ;;
    2) note "$tag: a rank exited before /health answered: $(cat "$TMP/$tag"-rank*.log | grep -m2 -E 'MISMATCH|Error' | tr '\n' ' ')" ;;
    1) note "$tag: /health answered 200 but the completion failed" ;;
    *) note "$tag: /health did not answer 200 within ${UP_TIMEOUT}s" ;;
    esac
    return 1
}

# wait_api_gone: the head's API port is closed (so the next check sees it free).
wait_api_gone() {
    local k
    for ((k = 0; k < 50; k++)); do
        [ "$(health_code)" = 000 ] && return 0
        sleep 0.1
    done
    note "the API at $API still answers after the ranks were stopped"
}

# ---------------------------------------------------------------- run ----

declare -A R=()
GIT_REV=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
CORES=$(nproc)
log "xfer $GIT_REV, $CORES cores, load $(cut -d' ' -f1-3 /proc/loadavg); NODES=\"$NODES\" LOADS=\"$LOADS\" RUNS=$RUNS"

for n in $NODES; do
    log "cluster of $n nodes (PREFIX $PREFIX)"
    cluster_up "$n"
    for load in $LOADS; do
        write_config "$n" "$load"
        chk=() ups=() downs=() hands=() firsts=() hfirsts=()
        for ((run = 1; run <= RUNS; run++)); do
            tag=n$n-l$load-r$run
            c=n/a u=n/a d=n/a h=n/a READY_S=n/a FIRST_S=n/a HAND_FIRST_S=n/a
            if time_check "$tag-check"; then c=$SECS; chk+=("$c"); fi
            if time_up "$tag-up"; then
                u=$SECS
                ups+=("$u")
                [ "$FIRST_S" = n/a ] || firsts+=("$FIRST_S")
            fi
            if time_down "$tag-down" && [ "$u" != n/a ]; then d=$SECS; downs+=("$d"); fi
            wait_api_gone
            if time_by_hand "$tag-hand" "$n"; then
                h=$SECS
                hands+=("$h")
                hfirsts+=("$HAND_FIRST_S")
            fi
            wait_api_gone
            log "$(printf 'N=%s L=%-3s #%d  check %5s  up %6s (ready %5s after its check; 1st completion %5s)  down %5s  by hand %6s (1st completion %5s)' \
                "$n" "$load" "$run" "$(fmt %.2f "$c")" "$(fmt %.2f "$u")" "$(fmt %.2f "$READY_S")" "$(fmt %.2f "$FIRST_S")" "$(fmt %.2f "$d")" "$(fmt %.2f "$h")" "$(fmt %.2f "$HAND_FIRST_S")")"
        done
        k=$n/$load
        R[check_$k]=$(median "${chk[@]}")
        R[up_$k]=$(median "${ups[@]}")
        R[down_$k]=$(median "${downs[@]}")
        R[hand_$k]=$(median "${hands[@]}")
        R[first_$k]=$(median "${firsts[@]}")
        R[hfirst_$k]=$(median "${hfirsts[@]}")
    done
    cluster_down
done

# ---------------------------------------------------------------- report ----

ROWS=()
overheads=() ratios=()
for n in $NODES; do
    for load in $LOADS; do
        k=$n/$load
        u=${R[up_$k]} h=${R[hand_$k]}
        if [[ $u != n/a && $h != n/a ]]; then
            o=$(calc "$u - $h")
            overheads+=("$o")
            ratios+=("$(ratio "$u" "$h")")
        else
            o=n/a
        fi
        ROWS+=("$n"$'\t'"$load"$'\t'"$(fmt %.2f "${R[check_$k]}")"$'\t'"$(fmt %.2f "$u")"$'\t'"$(fmt %.2f "$h")"$'\t'"$(ratio "$u" "$h")"$'\t'"$(fmt %+.2f "$o")"$'\t'"$(fmt %.2f "${R[down_$k]}")"$'\t'"$(fmt %.2f "${R[first_$k]}")"$'\t'"$(fmt %.2f "${R[hfirst_$k]}")")
    done
done

# check at the smallest and the largest N (the first load time).
first_load=${LOADS%% *}
# shellcheck disable=SC2086 # NODES is a space-separated list
ns=$(printf '%s\n' $NODES | sort -n)
n_lo=$(head -n1 <<<"$ns") n_hi=$(tail -n1 <<<"$ns")
c_lo=${R[check_$n_lo/$first_load]} c_hi=${R[check_$n_hi/$first_load]}
if [ ${#overheads[@]} -gt 0 ]; then
    ospan="$(fmt %.1f "$(printf '%s\n' "${overheads[@]}" | sort -g | head -n1)")-$(fmt %.1f "$(maxof "${overheads[@]}")") s"
    rspan="$(printf '%s\n' "${ratios[@]}" | sort -g | head -n1)-$(maxof "${ratios[@]}")x"
else
    ospan=n/a rspan=n/a
fi

{
    echo
    if [ "$ENGINE" = vllm ]; then what="real vLLM $("$ENGINE_BIN/python" -c 'import vllm.version as v; print(v.__version__)' 2>/dev/null) (CPU, tp 2)"; else what="stand-in vLLM"; fi
    echo "== xfer-launch vs by hand: xfer $GIT_REV, host cores: $CORES, RUNS=$RUNS (medians), $what, $(date -u +%Y-%m-%dT%H:%MZ) =="
    {
        printf 'N\tL s\tcheck s\tup s\tby-hand s\tup/by-hand\toverhead s\tdown s\t1st up s\t1st hand s\n'
        printf '%s\n' "${ROWS[@]}"
    } | column -t -s $'\t'
    echo "Summary: xfer-launch up costs $ospan over launching the plan by hand ($rspan of the by-hand time); check takes $(fmt %.2f "$c_lo") s at N=$n_lo and $(fmt %.2f "$c_hi") s at N=$n_hi."
    if [ ${#PROBLEMS[@]} -gt 0 ]; then
        echo
        echo "Problems seen:"
        printf -- '- %s\n' "${PROBLEMS[@]}"
    fi
}
