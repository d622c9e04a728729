#!/usr/bin/env bash
# Striped intake bench (issue 36): `xfer sync ORG/NAME --from all`, every
# node fetching ranges of the repo from the Hub over its own link, against
# today's one-node intake (`--from n1`, the streamed pull), side by side in
# one run. `scripts/bench-pull.sh stripes` runs it too.
#
#   scripts/bench-stripes.sh          (root; ~6 min at the defaults)
#
# Setup: scripts/launchnet.sh nodes (PREFIX xbs, management MGMT_NET.i.0/24
# holding each node's default route, fabric FABRIC_NET.i). The Hub
# look-alike (tests/hub_server.py) runs in the root namespace on node 1's
# management gateway address; every node reaches it over its own
# management link, its "internet", shaped to INET_MBIT both ways; the
# fabric is shaped to FABRIC_MBIT; the CDN caps each connection at
# CDN_MBIT. A SIZE_MIB repo (SHARDS shards). Every case starts from empty
# roots and ends when `xfer sync --wait` says every node holds the model.
#
#   one N      --from n1 --nodes n1..nN: n1 pulls, streams to the others
#   striped N  --from all: every node fetches ranges, n1 checks every file
#   shared     the same, every node behind ONE uplink of INET_MBIT (the
#              Hub look-alike's --total-rate), N = the largest of NODES
#   degraded   striped on the largest N, node 2's link slowed to a tenth
#              from the start and node 3's agent killed (kill -9, then
#              started again) once the Hub served a quarter of the repo
#
# Printed per case: seconds, the ideal, the ratio, what the Hub served as a
# multiple of the repo, each node's share, CPU idle. Floors (issue 36):
# striped <= 1.15 x max(S/(N*I), S/F) and Hub egress <= 1.02 x S; shared
# <= 1.05 x one; degraded <= 1.3 x the survivors' ideal, S over the links
# of the nodes left at full rate plus the slowed one's tenth.
#
# Env [default]: NODES ["2 4"], SIZE_MIB [512], SHARDS [4], INET_MBIT
# [100], FABRIC_MBIT [1000], CDN_MBIT [INET_MBIT/4], BENCH_DIR
# [/var/tmp/xfer-bench-stripes], SKIP_BUILD [0], KEEP_RUN [0], MGMT_NET
# [10.95], FABRIC_NET [10.96.0], PREFIX [xbs], CASES ["one striped shared
# degraded"]: a subset for a quick look (the report's comparisons need
# one and striped, and shared both of its cases).
set -euo pipefail
shopt -s inherit_errexit
export LC_ALL=C

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPT_DIR/.." && pwd)
LOG_TAG=stripes
# shellcheck source=scripts/lib-bench.sh
source "$SCRIPT_DIR/lib-bench.sh"

NODES=${NODES:-2 4}
SIZE_MIB=${SIZE_MIB:-512}
SHARDS=${SHARDS:-4}
INET_MBIT=${INET_MBIT:-100}
FABRIC_MBIT=${FABRIC_MBIT:-1000}
CDN_MBIT=${CDN_MBIT:-$((INET_MBIT / 4))}
BENCH_DIR=${BENCH_DIR:-/var/tmp/xfer-bench-stripes}
SKIP_BUILD=${SKIP_BUILD:-0}
KEEP_RUN=${KEEP_RUN:-0}
CASES=${CASES:-one striped shared degraded}
for c in $CASES; do
    [[ $c =~ ^(one|striped|shared|degraded)$ ]] || die "CASES: one, striped, shared, degraded (got '$c')"
done
want() { [[ " $CASES " == *" $1 "* ]]; }
export PREFIX=${PREFIX:-xbs} MGMT_NET=${MGMT_NET:-10.95} FABRIC_NET=${FABRIC_NET:-10.96.0}
MAXN=0
for n in $NODES; do
    [[ $n =~ ^[0-9]+$ && $n -ge 2 && $n -le 8 ]] || die "NODES: counts 2..8 (got '$n')"
    ((n > MAXN)) && MAXN=$n
done
for v in SIZE_MIB SHARDS INET_MBIT FABRIC_MBIT CDN_MBIT; do
    posint "${!v}" || die "$v must be a positive integer (got '${!v}')"
done
[ "$(id -u)" = 0 ] || die "run as root (network namespaces, tc)"
for t in python3 curl jq nft ip tc; do command -v "$t" >/dev/null || die "$t is not installed"; done

NET=$SCRIPT_DIR/launchnet.sh
AGENT_PORT=7470
ORG_NAME=bench/stripes-${SIZE_MIB}m
NAME=models--bench--stripes-${SIZE_MIB}m
REPOS=$BENCH_DIR/repos
TMP=$(mktemp -d /tmp/xfer-bench-stripes.XXXXXX)
KEY=$TMP/cluster.key
AGENT_PIDS=()
NET_UP=0

cleanup() {
    local rc=$?
    set +e
    trap - EXIT INT TERM
    stop_all
    # The agent the degraded case restarted from its hook is not our child.
    pkill -9 -f -- "--root $TMP/node" 2>/dev/null
    if [ "$NET_UP" = 1 ]; then "$NET" down >/dev/null 2>&1; fi
    if [ "$KEEP_RUN" = 1 ] || [ "$rc" != 0 ]; then log "scratch kept in $TMP"; else rm -rf "$TMP"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

mkdir -p "$BENCH_DIR" "$TMP/bin"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$REPO/target}
if [ "$SKIP_BUILD" != 1 ]; then
    log "building xfer (release)"
    (cd "$REPO" && cargo build --release -p xfer >&2)
fi
cp "$CARGO_TARGET_DIR/release/xfer" "$TMP/bin/xfer"
XFER=$TMP/bin/xfer
"$XFER" keygen --out "$KEY" >/dev/null
export XDG_STATE_HOME=$TMP/state XDG_CACHE_HOME=$TMP/cache
unset RUST_LOG

gen_repo "$ORG_NAME" "$SIZE_MIB" "$SHARDS"
S=$(tree_bytes "$REPOS/$ORG_NAME")

# ---------------------------------------------------------------- cluster ----

ns() { echo "$PREFIX-n$1"; }
fabric_if() { if (($1 % 2)); then echo fab0; else echo enp1s0f1; fi; }
mlink() { echo "$PREFIX-m$1"; }

log "$MAXN nodes: internet $INET_MBIT Mbit/s each, fabric $FABRIC_MBIT Mbit/s, CDN $CDN_MBIT Mbit/s per connection"
NET_UP=1
"$NET" up "$MAXN" >&2 || die "launchnet.sh up $MAXN failed (set MGMT_NET/FABRIC_NET to free ranges)"
# shape_inet I MBIT: node I's internet link, both ways.
shape_inet() {
    tc qdisc replace dev "$(mlink "$1")" root tbf rate "${2}mbit" burst 64kb latency 100ms
    ip netns exec "$(ns "$1")" tc qdisc replace dev mgmt0 root tbf rate "${2}mbit" burst 64kb latency 100ms
}
for ((i = 1; i <= MAXN; i++)); do
    shape_inet "$i" "$INET_MBIT"
    ip netns exec "$(ns "$i")" tc qdisc replace dev "$(fabric_if "$i")" root tbf \
        rate "${FABRIC_MBIT}mbit" burst 256kb latency 50ms
done

HUB_HOST=$MGMT_NET.1.1
HUB_PID=
# start_hub [TOTAL_RATE]: the Hub look-alike, anew (its counters at zero).
start_hub() {
    if [ -n "$HUB_PID" ]; then stop_pid "$HUB_PID"; fi
    : >"$TMP/hub.out"
    python3 -u "$REPO/tests/hub_server.py" --repos "$REPOS" --host "$HUB_HOST" \
        --rate $((CDN_MBIT * 125000)) --total-rate "${1:-0}" >"$TMP/hub.out" 2>"$TMP/hub.err" </dev/null &
    HUB_PID=$!
    track "$HUB_PID"
    HUB_PORT=$(hub_port "$TMP/hub" "$HUB_PID")
    export HF_ENDPOINT=http://$HUB_HOST:$HUB_PORT
}
served() { curl -sf "$HF_ENDPOINT/_stats" | jq -r '.bytes_served // 0'; }

start_agent() {
    local i=$1 k
    mkdir -p "$TMP/node$i"
    : >"$TMP/agent$i.out"
    ip netns exec "$(ns "$i")" env HF_HUB_DISABLE_XET=1 "$XFER" serve --listen "0.0.0.0:$AGENT_PORT" \
        --root "$TMP/node$i" --key "$KEY" --verify-every 0 \
        >"$TMP/agent$i.out" 2>>"$TMP/agent$i.log" </dev/null &
    AGENT_PIDS[i]=$!
    track "${AGENT_PIDS[i]}"
    for ((k = 0; k < 150; k++)); do
        grep -q listening "$TMP/agent$i.out" && return 0
        sleep 0.1
    done
    die "agent $i did not start: $(tail -n3 "$TMP/agent$i.log")"
}
fresh_nodes() { # N
    local i
    for ((i = 1; i <= MAXN; i++)); do
        if [ -n "${AGENT_PIDS[i]:-}" ]; then stop_pid "${AGENT_PIDS[i]}"; fi
    done
    pkill -9 -f -- "--root $TMP/node" 2>/dev/null || true
    for ((i = 1; i <= MAXN; i++)); do rm -rf "$TMP/node$i"; done
    for ((i = 1; i <= $1; i++)); do start_agent "$i"; done
}
CF=$TMP/cluster.toml
{
    echo "key = \"$KEY\""
    for ((i = 1; i <= MAXN; i++)); do
        printf '\n[[node]]\nname = "n%d"\nagent = "%s.%d.2:%d"\nroot = "%s"\nfabric_if = "%s"\nfabric_ip = "%s.%d"\n' \
            "$i" "$MGMT_NET" "$i" "$AGENT_PORT" "$TMP/node$i" "$(fabric_if "$i")" "$FABRIC_NET" "$i"
    done
} >"$CF"
node_list() { local i out=n1; for ((i = 2; i <= $1; i++)); do out+=",n$i"; done; echo "$out"; }

# ------------------------------------------------------------------ cases ----

ROWS=()
# run_case LABEL N FROM IDEAL_S [HOOK]: one sync from empty roots; HOOK
# runs in the background while it does.
run_case() {
    local label=$1 n=$2 from=$3 ideal=$4 hook=${5:-} t0 t1 idle0 idle1 secs egress line shares hook_pid=""
    fresh_nodes "$n"
    curl -sf -X POST "$HF_ENDPOINT/_stats/reset" >/dev/null
    read -r idle0 tot0 < <(cpu_idle_total)
    t0=$EPOCHREALTIME
    if [ -n "$hook" ]; then
        "$hook" &
        hook_pid=$!
    fi
    "$XFER" sync "$ORG_NAME" --cluster "$CF" --from "$from" --nodes "$(node_list "$n")" --wait \
        >"$TMP/sync-$label.out" 2>"$TMP/sync-$label.err" ||
        die "$label: xfer sync failed: $(tail -n3 "$TMP/sync-$label.err")"
    t1=$EPOCHREALTIME
    if [ -n "$hook_pid" ]; then wait "$hook_pid" || true; fi
    read -r idle1 tot1 < <(cpu_idle_total)
    secs=$(calc "$t1 - $t0")
    egress=$(calc "$(served) / $S")
    line=$("$XFER" status --cluster "$CF" 2>/dev/null | grep "^job .*$NAME" | tail -n1 || true)
    shares=$(sed -n 's/.*from the Hub: \([^;]*\).*/\1/p' <<<"$line")
    local named
    named=$(grep -o '[a-z0-9]* named: [^;]*' <<<"$line" || true)
    ROWS+=("| $label | $n | $(fmt %.1f "$secs") | $(fmt %.1f "$ideal") | $(fmt %.2f "$(calc "$secs / $ideal")") | $(fmt %.3f "$egress") | ${shares:-n1 all} ${named:+($named)} | $(fmt %.0f "$(calc "100 * ($idle1 - $idle0) / ($tot1 - $tot0)")") |")
    log "$label (N=$n): $(fmt %.1f "$secs") s, ideal $(fmt %.1f "$ideal") s, Hub egress $(fmt %.3f "$egress") x S"
    eval "T_${label//[^a-zA-Z0-9]/_}=$secs"
}

I_BPS=$((INET_MBIT * 1000000 / 8))
F_BPS=$((FABRIC_MBIT * 1000000 / 8))
ideal_of() { # BYTES_PER_S_OF_INTAKE
    local a b
    a=$(calc "$S / $1")
    b=$(calc "$S / $F_BPS")
    awk -v a="$a" -v b="$b" 'BEGIN { printf "%.6f", (a > b ? a : b) }'
}

start_hub 0
for n in $NODES; do
    if want one; then run_case "one-$n" "$n" n1 "$(ideal_of "$I_BPS")"; fi
    if want striped; then run_case "striped-$n" "$n" all "$(ideal_of $((n * I_BPS)))"; fi
done

# Every node behind one uplink of INET_MBIT: the look-alike's total pace.
if want shared; then
    for ((i = 1; i <= MAXN; i++)); do shape_inet "$i" $((INET_MBIT * 4)); done
    start_hub "$I_BPS"
    run_case "shared-one-$MAXN" "$MAXN" n1 "$(ideal_of "$I_BPS")"
    run_case "shared-striped-$MAXN" "$MAXN" all "$(ideal_of "$I_BPS")"
    for ((i = 1; i <= MAXN; i++)); do shape_inet "$i" "$INET_MBIT"; done
    start_hub 0
fi

# Node 2 at a tenth from the start; node 3 killed once a quarter is served.
kill_third() {
    local k
    for ((k = 0; k < 6000; k++)); do
        [ "$(served)" -ge $((S / 4)) ] && break
        sleep 0.05
    done
    kill -9 "${AGENT_PIDS[3]}" 2>/dev/null || true
    log "degraded: n3's agent killed at $(calc "$(served) / $S") x S served; started again"
    start_agent 3
}
if ((MAXN >= 3)) && want degraded; then
    shape_inet 2 $((INET_MBIT / 10))
    SURVIVORS=$(calc "($MAXN - 2) * $I_BPS + $I_BPS / 10")
    run_case "degraded-$MAXN" "$MAXN" all "$(ideal_of "$SURVIVORS")" kill_third
    shape_inet 2 "$INET_MBIT"
fi

# ------------------------------------------------------------------ report ----

{
    echo
    echo "### Striped intake, $(date -u '+%Y-%m-%d %H:%M') UTC, $(cd "$REPO" && git rev-parse --short HEAD 2>/dev/null || echo '?')"
    echo
    echo "S = $S bytes ($SHARDS shards); each node's internet $INET_MBIT Mbit/s, fabric $FABRIC_MBIT Mbit/s, CDN $CDN_MBIT Mbit/s per connection."
    echo
    echo "| case | N | s | ideal s | / ideal | Hub egress x S | from the Hub | CPU idle % |"
    echo "|---|---|---|---|---|---|---|---|"
    printf '%s\n' "${ROWS[@]}"
    echo
    if want one && want striped; then
        for n in $NODES; do
            one=T_one_$n
            st=T_striped_$n
            echo "N=$n: striped $(fmt %.1f "${!st}") s against one-node intake $(fmt %.1f "${!one}") s: $(fmt %.2f "$(calc "${!one} / ${!st}")") x faster."
        done
    fi
    if want shared; then
        echo "Shared uplink: striped / one = $(fmt %.2f "$(calc "$(eval echo "\$T_shared_striped_$MAXN") / $(eval echo "\$T_shared_one_$MAXN")")") (floor <= 1.05)."
    fi
    echo "Floors: striped <= 1.15 x ideal, egress <= 1.02 x S; degraded <= 1.3 x the survivors' ideal."
} | tee -a "$BENCH_DIR/summary.md"
