#!/usr/bin/env bash
# The operator's first hour, measured: how long a mistake takes to say its
# cause, `xfer sync --wait` against huggingface_hub's `hf download` on the
# same local Hub-protocol server (tests/hub_server.py), in one invocation.
#
#   scripts/bench-first-hour.sh
#
# Two xfer agents on 127.0.0.2 and 127.0.0.3 (their own roots, per-node
# credentials from `xfer ca`, a cluster file named by XFER_CLUSTER), one
# small repo on the server. RUNS runs of each case, medians:
#   typo   a repo that does not exist: `xfer sync ORG/TYPO --wait` and
#          `hf download ORG/TYPO`, each to its exit. Seconds, exit code, and
#          whether the output carries the server's 404 ("not found").
#   down   HF_ENDPOINT at a closed port. xfer: seconds from `xfer sync` (no
#          --wait) until `xfer status` shows "connection refused" and the
#          attempt number (the job keeps retrying, as it should); hf: seconds
#          to its error exit (hf gives up).
#   ok     the real repo: `xfer sync --wait` onto both nodes against `hf
#          download` into one cache: what success costs on this setup, so
#          the error figures have a scale.
# Before issue 32 the typo case never ended (a 404 was retried forever with
# full bars) and the down case showed "channel closed", not the cause.
#
# Prints a Markdown table with xfer / hf per case; appends it to
# $FH_DIR/summary.txt. Exit 3 when xfer takes over 5 s to fail a typo'd
# repo (issue 32's floor).
#
# Env [default]: RUNS [3], REPO_MIB [64], PORT [17610] (agents, UDP),
# XFER [target/release/xfer; built with `cargo build --release -p xfer`
# if missing], HF_VENV [/var/tmp/xfer-venv-hf; created with huggingface_hub
# if missing], FH_DIR [/var/tmp/xfer-bench-first-hour].
# Runtime on 2 cores: about 1 minute at the defaults.

set -euo pipefail
shopt -s inherit_errexit
export LC_ALL=C

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPT_DIR/.." && pwd)
LOG_TAG=first-hour
# shellcheck source=scripts/lib-bench.sh
source "$SCRIPT_DIR/lib-bench.sh"

RUNS=${RUNS:-3}
REPO_MIB=${REPO_MIB:-64}
PORT=${PORT:-17610}
HF_VENV=${HF_VENV:-/var/tmp/xfer-venv-hf}
FH_DIR=${FH_DIR:-/var/tmp/xfer-bench-first-hour}
RUN=$FH_DIR/run
trap 'stop_all' EXIT

XFER_BIN=${XFER:-$REPO/target/release/xfer}
if [ ! -x "$XFER_BIN" ]; then
    log "no release binary at $XFER_BIN: running cargo build --release -p xfer"
    (cd "$REPO" && cargo build --release -p xfer) >&2 || die "cargo build --release -p xfer failed"
fi
if [ ! -x "$HF_VENV/bin/hf" ]; then
    log "creating $HF_VENV with huggingface_hub"
    python3 -m venv "$HF_VENV" >&2 && "$HF_VENV/bin/pip" install -q huggingface_hub >&2 ||
        die "could not install huggingface_hub into $HF_VENV"
fi
need curl curl
! port_busy -u "$PORT" || die "UDP port $PORT is busy; set PORT"

fresh_dir "$RUN"
mkdir -p "$FH_DIR/repos/bench/small"
if [ ! -f "$FH_DIR/repo-small.complete" ]; then
    head -c $((REPO_MIB << 20)) /dev/urandom >"$FH_DIR/repos/bench/small/model.safetensors"
    echo '{"architectures": ["BenchForCausalLM"]}' >"$FH_DIR/repos/bench/small/config.json"
    touch "$FH_DIR/repo-small.complete"
fi

# The server (its first start hashes the repo).
python3 -u "$REPO/tests/hub_server.py" --repos "$FH_DIR/repos" --host 127.0.0.1 >"$RUN/hub.out" 2>"$RUN/hub.err" &
HUB_PID=$!
track "$HUB_PID"
for ((i = 0; i < 600; i++)); do
    grep -qs '^READY ' "$RUN/hub.out" && break
    kill -0 "$HUB_PID" 2>/dev/null || die "hub_server.py exited: $(tail -n 3 "$RUN/hub.err")"
    sleep 0.1
done
HUB_URL=http://127.0.0.1:$(awk '/^READY / { print $2; exit }' "$RUN/hub.out")
# A port nothing listens on: bind one, close it.
DEAD_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
DEAD_URL=http://127.0.0.1:$DEAD_PORT

# Credentials, agents (with no Hub settings of their own), cluster file.
cd "$RUN"
"$XFER_BIN" ca init --dir ca >/dev/null
for n in a b; do "$XFER_BIN" ca issue "node-$n" --dir ca --out "node-$n.cred" >/dev/null; done
"$XFER_BIN" ca issue ops --role operator --dir ca --out ops.cred >/dev/null
start_agents() {
    local n ip
    for n in a b; do
        ip=127.0.0.2
        [ "$n" = b ] && ip=127.0.0.3
        fresh_dir "$RUN/root-$n"
        env -u HF_ENDPOINT -u HF_TOKEN "$XFER_BIN" serve --listen "$ip:$PORT" --root "$RUN/root-$n" \
            --key "node-$n.cred" >"$RUN/agent-$n.log" 2>&1 &
        track $!
        AGENTS+=($!)
    done
    for ((i = 0; i < 300; i++)); do
        [ "$(grep -c 'listening' "$RUN"/agent-*.log 2>/dev/null | awk -F: '{ s += $2 } END { print s }')" -ge 2 ] && return
        sleep 0.1
    done
    die "the agents did not start: $(tail -n 3 "$RUN"/agent-*.log)"
}
stop_agents() {
    local p
    for p in "${AGENTS[@]}"; do stop_pid "$p"; done
    AGENTS=()
}
AGENTS=()
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

# timed OUT_PREFIX CMD...: runs CMD (90 s at most), sets T_S and T_RC.
timed() {
    local out=$1 t0
    shift
    t0=$EPOCHREALTIME
    set +e
    timeout 90 "$@" >"$out.out" 2>"$out.err"
    T_RC=$?
    set -e
    T_S=$(elapsed "$t0" "$EPOCHREALTIME")
}
names_404() { grep -qiE '404|not found|does not exist' "$1.out" "$1.err" && echo yes || echo no; }

declare -a X_TYPO H_TYPO X_DOWN H_DOWN X_OK H_OK
X_TYPO_RC="" H_TYPO_RC="" X_TYPO_404="" H_TYPO_404=""
for ((r = 1; r <= RUNS; r++)); do
    log "run $r of $RUNS"
    start_agents
    # typo
    timed "$RUN/x-typo-$r" env HF_ENDPOINT="$HUB_URL" "$XFER_BIN" sync "bench/smal$r" --from node-a --wait
    X_TYPO+=("$T_S") X_TYPO_RC=$T_RC X_TYPO_404=$(names_404 "$RUN/x-typo-$r")
    timed "$RUN/h-typo-$r" env HF_ENDPOINT="$HUB_URL" HF_HOME="$RUN/hf-home-$r" "$HF_VENV/bin/hf" download "bench/smal$r"
    H_TYPO+=("$T_S") H_TYPO_RC=$T_RC H_TYPO_404=$(names_404 "$RUN/h-typo-$r")
    # down: xfer until status shows the cause and an attempt; hf to its exit
    t0=$EPOCHREALTIME
    HF_ENDPOINT=$DEAD_URL "$XFER_BIN" sync bench/small --from node-a >"$RUN/x-down-$r.out" 2>"$RUN/x-down-$r.err" ||
        die "xfer sync (hub down) was refused: $(cat "$RUN/x-down-$r.err")"
    job=$(head -n 1 "$RUN/x-down-$r.out")
    seen=""
    for ((i = 0; i < 900; i++)); do
        set +e
        "$XFER_BIN" status >"$RUN/x-down-$r.status" 2>&1
        set -e
        if grep -qi 'connection refused' "$RUN/x-down-$r.status" && grep -qi 'attempt' "$RUN/x-down-$r.status"; then
            seen=$(elapsed "$t0" "$EPOCHREALTIME")
            break
        fi
        sleep 0.1
    done
    [ -n "$seen" ] || die "xfer status never showed the refused connection: $(tail -n 5 "$RUN/x-down-$r.status")"
    X_DOWN+=("$seen")
    "$XFER_BIN" cancel "$job" >/dev/null 2>&1 || true
    timed "$RUN/h-down-$r" env HF_ENDPOINT="$DEAD_URL" HF_HOME="$RUN/hf-home-$r" "$HF_VENV/bin/hf" download bench/small
    H_DOWN+=("$T_S")
    # ok
    timed "$RUN/x-ok-$r" env HF_ENDPOINT="$HUB_URL" "$XFER_BIN" sync bench/small --from node-a --wait
    [ "$T_RC" = 0 ] || die "xfer sync bench/small failed: $(tail -n 3 "$RUN/x-ok-$r.err")"
    X_OK+=("$T_S")
    timed "$RUN/h-ok-$r" env HF_ENDPOINT="$HUB_URL" HF_HOME="$RUN/hf-home-ok-$r" "$HF_VENV/bin/hf" download bench/small
    [ "$T_RC" = 0 ] || die "hf download bench/small failed: $(tail -n 3 "$RUN/h-ok-$r.err")"
    H_OK+=("$T_S")
    stop_agents
done

XT=$(median "${X_TYPO[@]}") HT=$(median "${H_TYPO[@]}")
XD=$(median "${X_DOWN[@]}") HD=$(median "${H_DOWN[@]}")
XO=$(median "${X_OK[@]}") HO=$(median "${H_OK[@]}")
{
    printf '\nFirst hour (%s, %s; xfer %s, huggingface_hub %s), %d runs, medians:\n\n' \
        "$(date -u +%Y-%m-%dT%H:%MZ)" "$(nproc) cores" "$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo ?)" \
        "$("$HF_VENV/bin/python" -c 'import huggingface_hub; print(huggingface_hub.__version__)')" "$RUNS"
    echo '| case | xfer s | hf s | xfer / hf | xfer says | hf says |'
    echo '| --- | --- | --- | --- | --- | --- |'
    printf '| typo: repo does not exist, to exit | %.2f | %.2f | %s | exit %s, names the 404: %s | exit %s, names the 404: %s |\n' \
        "$XT" "$HT" "$(ratio "$XT" "$HT")" "$X_TYPO_RC" "$X_TYPO_404" "$H_TYPO_RC" "$H_TYPO_404"
    printf '| hub down: to the cause on screen | %.2f | %.2f | %s | status: connection refused, retrying (attempt N) | exit, error text |\n' \
        "$XD" "$HD" "$(ratio "$XD" "$HD")"
    printf '| success: %d MiB repo | %.2f (2 nodes) | %.2f (1 cache) | %s | | |\n' "$REPO_MIB" "$XO" "$HO" "$(ratio "$XO" "$HO")"
} | tee -a "$FH_DIR/summary.txt"
awk -v x="$XT" 'BEGIN { exit !(x > 5) }' && exit 3
exit 0
