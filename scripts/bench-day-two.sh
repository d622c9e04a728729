#!/usr/bin/env bash
# Day two, measured (issue 52): does a model that was fine stay fine while
# the operator re-syncs it, syncs it against a Hub that is down, and
# cancels syncs? And how long does a sync against a dead Hub take to give
# up, beside `hf download` against the same dead endpoint?
#
#   scripts/bench-day-two.sh
#
# Two xfer agents on 127.0.0.2 and 127.0.0.3 (per-node credentials from
# `xfer ca`), one repo on the Hub test server (tests/hub_server.py), synced
# to both once. Then ROUNDS seeded rounds, each one of:
#   same    `xfer sync --wait` of the revision both nodes hold (nothing to
#           write);
#   dead    the Hub stopped; `xfer sync --wait --give-up-after GIVE_UP`
#           (it must exit 1 with the cause); the Hub started again;
#   cancel  the Hub stopped; `xfer sync --give-up-after never`, cancelled
#           once `xfer status` shows it retrying; the Hub started again.
# During every round a sampler reads `xfer status --json` back to back and
# counts the observations in which either node does not show the model
# complete with its first root. Before issue 52 (same shape, 8 rounds,
# 1-second samples): 16 of 72 observations were not complete. The floor is 0.
#
# Prints a Markdown table; appends it to $D2_DIR/summary.txt. Exit 3 when
# any observation was not complete, or a dead-Hub sync did not exit 1.
#
# Env [default]: ROUNDS [8], SEED [52], GIVE_UP [3s], REPO_MIB [32],
# PORT [17620] (agents, UDP), XFER [target/release/xfer; built if missing],
# HF_VENV [/var/tmp/xfer-venv-hf], D2_DIR [/var/tmp/xfer-bench-day-two].
# Runtime on 2 cores: about a minute at the defaults.

set -euo pipefail
shopt -s inherit_errexit
export LC_ALL=C

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPT_DIR/.." && pwd)
LOG_TAG=day-two
# shellcheck source=scripts/lib-bench.sh
source "$SCRIPT_DIR/lib-bench.sh"

ROUNDS=${ROUNDS:-8}
SEED=${SEED:-52}
GIVE_UP=${GIVE_UP:-3s}
REPO_MIB=${REPO_MIB:-32}
PORT=${PORT:-17620}
HF_VENV=${HF_VENV:-/var/tmp/xfer-venv-hf}
D2_DIR=${D2_DIR:-/var/tmp/xfer-bench-day-two}
RUN=$D2_DIR/run
REPOS=$D2_DIR/repos
trap 'stop_all' EXIT

XFER_BIN=${XFER:-$REPO/target/release/xfer}
if [ ! -x "$XFER_BIN" ]; then
    log "no release binary at $XFER_BIN: running cargo build --release -p xfer"
    (cd "$REPO" && cargo build --release -p xfer) >&2 || die "cargo build --release -p xfer failed"
fi
! port_busy -u "$PORT" || die "UDP port $PORT is busy; set PORT"

fresh_dir "$RUN"
gen_repo bench/day-two "$REPO_MIB" 2

HUB_PORT=""
start_hub() {
    local args=(--repos "$REPOS" --host 127.0.0.1)
    [ -z "$HUB_PORT" ] || args+=(--port "$HUB_PORT")
    python3 -u "$REPO/tests/hub_server.py" "${args[@]}" >"$RUN/hub.out" 2>"$RUN/hub.err" &
    HUB_PID=$!
    track "$HUB_PID"
    HUB_PORT=$(hub_port "$RUN/hub" "$HUB_PID")
}
stop_hub() { stop_pid "$HUB_PID"; }
start_hub
export HF_ENDPOINT=http://127.0.0.1:$HUB_PORT

cd "$RUN"
"$XFER_BIN" ca init --dir ca >/dev/null
for n in a b; do "$XFER_BIN" ca issue "node-$n" --dir ca --out "node-$n.cred" >/dev/null; done
"$XFER_BIN" ca issue ops --role operator --dir ca --out ops.cred >/dev/null
for n in a b; do
    ip=127.0.0.2
    [ "$n" = b ] && ip=127.0.0.3
    fresh_dir "$RUN/root-$n"
    env -u HF_TOKEN "$XFER_BIN" serve --listen "$ip:$PORT" --root "$RUN/root-$n" \
        --key "node-$n.cred" >"$RUN/agent-$n.log" 2>&1 &
    track $!
done
for ((i = 0; i < 300; i++)); do
    [ "$(grep -c 'listening' "$RUN"/agent-*.log 2>/dev/null | awk -F: '{ s += $2 } END { print s }')" -ge 2 ] && break
    sleep 0.1
done
cat >cluster.toml <<EOF
key = "ops.cred"

[[node]]
name = "node-a"
agent = "127.0.0.2:$PORT"
root = "$RUN/root-a"

[[node]]
name = "node-b"
agent = "127.0.0.3:$PORT"
root = "$RUN/root-b"
EOF
export XFER_CLUSTER=$RUN/cluster.toml
export HF_HUB_DISABLE_PROGRESS_BARS=1 HF_HUB_DISABLE_TELEMETRY=1 HF_HUB_ETAG_TIMEOUT=10 HF_HUB_DOWNLOAD_TIMEOUT=10
unset HF_TOKEN

NAME=models--bench--day-two
"$XFER_BIN" sync hf://bench/day-two --from node-a --nodes node-a,node-b --wait --json >"$RUN/first.json" 2>"$RUN/first.err" ||
    die "the first sync failed: $(tail -n 3 "$RUN/first.err")"
ROOT=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["root"])' "$RUN/first.json")
log "both nodes hold $NAME, root ${ROOT:0:12}"

# sampler OUT: reads status back to back until $RUN/stop exists; writes
# "observations not_complete" to OUT.
sampler() {
    local out=$1 n=0 bad=0 ok
    while [ ! -e "$RUN/stop" ]; do
        set +e
        "$XFER_BIN" status --json >"$RUN/sample.json" 2>/dev/null
        set -e
        ok=$(python3 - "$RUN/sample.json" "$NAME" "$ROOT" <<'PY'
import json, sys
try:
    reports = json.load(open(sys.argv[1]))
except Exception:
    print("skip"); sys.exit()
name, root = sys.argv[2], sys.argv[3]
fine, seen = 0, []
for r in reports:
    for m in ((r.get("status") or {}).get("models") or []):
        if m.get("name") == name:
            seen.append(f'{r.get("node")}: {m.get("state")} {str(m.get("root"))[:12]}')
            if m.get("state") == "complete" and m.get("root") == root:
                fine += 1
print("yes" if fine == 2 else "no " + "; ".join(seen))
PY
)
        [ "$ok" = skip ] && continue
        n=$((n + 1))
        if [ "$ok" != yes ]; then
            bad=$((bad + 1))
            echo "${ok#no }" >>"$out.seen"
        fi
    done
    echo "$n $bad" >"$out"
}

# timed OUT CMD...: runs CMD (120 s at most); sets T_S and T_RC.
timed() {
    local out=$1 t0
    shift
    t0=$EPOCHREALTIME
    set +e
    timeout 120 "$@" >"$out.out" 2>"$out.err"
    T_RC=$?
    set -e
    T_S=$(elapsed "$t0" "$EPOCHREALTIME")
}

RANDOM=$SEED
OBS=0 BAD=0 DEAD_RC_OK=1
declare -a KINDS DEAD_S HF_S
for ((r = 1; r <= ROUNDS; r++)); do
    kinds=(same dead cancel)
    # Each kind once first, then as the seed says.
    if ((r <= 3)); then kind=${kinds[r - 1]}; else kind=${kinds[RANDOM % 3]}; fi
    KINDS+=("$kind")
    rm -f "$RUN/stop"
    sampler "$RUN/obs-$r" &
    SAMPLER=$!
    case $kind in
    same)
        timed "$RUN/same-$r" "$XFER_BIN" sync hf://bench/day-two --from node-a --nodes node-a,node-b --wait
        [ "$T_RC" = 0 ] || die "a re-sync of the held revision failed: $(tail -n 2 "$RUN/same-$r.err")"
        ;;
    dead)
        stop_hub
        timed "$RUN/dead-$r" "$XFER_BIN" sync hf://bench/day-two --from node-a --nodes node-a,node-b --wait --give-up-after "$GIVE_UP"
        [ "$T_RC" = 1 ] || DEAD_RC_OK=0
        DEAD_S+=("$T_S")
        timed "$RUN/hf-dead-$r" env HF_HOME="$RUN/hf-home" "$HF_VENV/bin/hf" download bench/day-two
        HF_S+=("$T_S")
        start_hub
        ;;
    cancel)
        stop_hub
        job=$("$XFER_BIN" sync hf://bench/day-two --from node-a --nodes node-a,node-b --give-up-after never 2>/dev/null | head -n 1)
        for ((i = 0; i < 600; i++)); do
            set +e
            "$XFER_BIN" status >"$RUN/cancel-$r.status" 2>&1
            set -e
            grep -q "retrying (attempt" "$RUN/cancel-$r.status" && break
            sleep 0.05
        done
        "$XFER_BIN" cancel "$job" >/dev/null 2>&1 || die "xfer cancel $job failed"
        start_hub
        ;;
    esac
    touch "$RUN/stop"
    wait "$SAMPLER"
    read -r n bad <"$RUN/obs-$r"
    OBS=$((OBS + n)) BAD=$((BAD + bad))
    log "round $r ($kind): $bad of $n observations not complete"
    "$XFER_BIN" prune >/dev/null 2>&1 || true
done
# The records themselves, beside what status said.
REPLACING=$({ grep -l '"replacing"' "$RUN"/root-*/.xfer/models/"$NAME".json 2>/dev/null || true; } | wc -l)

{
    printf '\nDay two (%s, %s; xfer %s), %d rounds (seed %s: %s):\n\n' \
        "$(date -u +%Y-%m-%dT%H:%MZ)" "$(nproc) cores" "$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo ?)" \
        "$ROUNDS" "$SEED" "${KINDS[*]}"
    echo '| measure | xfer | baseline |'
    echo '| --- | --- | --- |'
    printf '| observations of the held model not complete | %d of %d | 16 of 72 before issue 52; floor 0 |\n' "$BAD" "$OBS"
    printf '| records left `replacing` at the end | %d of 2 | 0 |\n' "$REPLACING"
    if ((${#DEAD_S[@]})); then
        printf '| dead Hub: `sync --wait --give-up-after %s` to exit 1 (median) | %.2f s | `hf download` %.2f s (gives up at once; xfer retries for its budget) |\n' \
            "$GIVE_UP" "$(median "${DEAD_S[@]}")" "$(median "${HF_S[@]}")"
    fi
} | tee -a "$D2_DIR/summary.txt"
if [ "$BAD" -gt 0 ] || [ "$REPLACING" -gt 0 ] || [ "$DEAD_RC_OK" = 0 ]; then
    exit 3
fi
