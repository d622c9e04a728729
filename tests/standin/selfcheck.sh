#!/usr/bin/env bash
# Self-check of the stand-in engine on a two-node, two-NIC namespace cluster
# (scripts/launchnet.sh, PREFIX=xlsc): the vLLM ranks of a plan, run with the
# plan's exact argv and environment, form their group over the fabric and
# serve the API through the management network; a crash takes the group
# down; a hang ignores SIGTERM; a wrong interface is a MISMATCH (exit 3).
#
#   sudo tests/standin/selfcheck.sh
#
# The plan comes from `xfer-launch plan --json` when the binary is there
# (XFER_LAUNCH, else $CARGO_TARGET_DIR/debug/xfer-launch, else
# target/debug/xfer-launch), otherwise from the same JSON written here.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
STANDIN=$REPO/tests/standin
NET=$REPO/scripts/launchnet.sh
export PREFIX=xlsc
COMMIT=0123456789abcdef0123456789abcdef01234567

[[ $(id -u) -eq 0 ]] || { echo "selfcheck: needs root (network namespaces)" >&2; exit 1; }
command -v curl >/dev/null || { echo "selfcheck: needs curl" >&2; exit 1; }

TMP=$(mktemp -d /tmp/standin-selfcheck.XXXXXX)
PIDS=()
FAILS=0
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    # Anything of ours still running (by its STANDIN_OUT, which names $TMP).
    for p in $(pgrep -f 'engine\.py' || true); do
        if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "STANDIN_OUT=$TMP/out"; then
            kill -9 "$p" 2>/dev/null || true
        fi
    done
    "$NET" down || true
    if ((FAILS)); then echo "selfcheck: logs kept in $TMP" >&2; else rm -rf "$TMP"; fi
}
trap cleanup EXIT

pass() { echo "ok   - $*"; }
fail() { echo "FAIL - $*"; FAILS=$((FAILS + 1)); }
check() { local what=$1; shift; if "$@"; then pass "$what"; else fail "$what"; fi; }

"$NET" up 2

# --- the plan ---------------------------------------------------------------
HUB=$TMP/hub
MODEL_DIR=$HUB/models--Qwen--Qwen3-8B/snapshots/$COMMIT
mkdir -p "$MODEL_DIR"
cat >"$TMP/cluster.toml" <<EOF
key = "$TMP/cluster.key"

[defaults]
root = "$HUB"

[[node]]
name = "n1"
agent = "10.79.1.2"
fabric_if = "fab0"
fabric_ip = "10.80.0.1"

[[node]]
name = "n2"
agent = "10.79.2.2"
fabric_if = "enp1s0f1"
fabric_ip = "10.80.0.2"

[launch]
engine = "vllm"
model = "Qwen/Qwen3-8B"
EOF
XL=${XFER_LAUNCH:-${CARGO_TARGET_DIR:-$REPO/target}/debug/xfer-launch}
if [[ -x $XL ]]; then
    "$XL" plan --cluster "$TMP/cluster.toml" --json >"$TMP/plan.json"
    echo "plan: from $XL"
else
    python3 - "$HUB" >"$TMP/plan.json" <<'EOF'
import json, sys
hub = sys.argv[1]
model = f"{hub}/models--Qwen--Qwen3-8B/snapshots/<COMMIT>"
def rank(r, node, ifname, ip):
    a = ["vllm", "serve", model, "--tensor-parallel-size", "1", "--pipeline-parallel-size", "2",
         "--nnodes", "2", "--node-rank", str(r), "--master-addr", "10.80.0.1", "--master-port", "29500"]
    a += ["--port", "8000"] if r == 0 else ["--headless"]
    env = {"GLOO_SOCKET_IFNAME": ifname, "HF_HUB_OFFLINE": "1",
           "NCCL_SOCKET_IFNAME": "=" + ifname, "VLLM_HOST_IP": ip}
    return {"node": node, "rank": r, "role": "head" if r == 0 else "worker", "fabric_if": ifname,
            "fabric_ip": ip, "env": env, "pre": [], "argv": a}
print(json.dumps({"engine": "vllm", "model": model, "tp": 1, "pp": 2, "nnodes": 2, "head": "n1",
                  "head_ip": "10.80.0.1", "api_port": 8000, "notes": [],
                  "ranks": [rank(0, "n1", "fab0", "10.80.0.1"), rank(1, "n2", "enp1s0f1", "10.80.0.2")]},
                 indent=2))
EOF
    echo "plan: written by hand (no xfer-launch binary at $XL)"
fi
grep -q '<COMMIT>' "$TMP/plan.json" || { echo "selfcheck: the plan has no <COMMIT> placeholder" >&2; exit 1; }

# The command line of rank R: env -i, the plan's env (K=V overrides after it),
# PATH/PYTHONPATH, the plan's argv with the commit filled in.
cmdline() { # PLAN RANK [K=V...]
    python3 - "$@" <<EOF
import json, sys
plan, r, extra = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
rk = json.load(open(plan))["ranks"][r]
env = dict(rk["env"])
env.update(PATH="$STANDIN/bin:/usr/local/bin:/usr/bin:/bin", PYTHONPATH="$STANDIN/pylib",
           STANDIN_PLAN=plan, STANDIN_OUT="$TMP/out")
for kv in extra:
    k, v = kv.split("=", 1)
    env[k] = v
argv = [w.replace("<COMMIT>", "$COMMIT") for w in rk["argv"]]
sys.stdout.write("\0".join(["env", "-i"] + [f"{k}={v}" for k, v in env.items()] + argv) + "\0")
EOF
}

# start TAG NODE PLAN RANK [K=V...]: run rank RANK in node NODE; sets $LAST,
# the engine's own pid (launchnet.sh, ip netns exec, env and the wrapper exec).
start() {
    local tag=$1 node=$2 plan=$3 r=$4
    shift 4
    local -a cmd
    mapfile -d '' cmd < <(cmdline "$plan" "$r" "$@")
    "$NET" exec "$node" "${cmd[@]}" >"$TMP/$tag.out" 2>"$TMP/$tag.err" &
    LAST=$!
    PIDS+=("$LAST")
}

# wait_exit PID SECS: sets RC to the exit code, or 255 if still running
# after SECS (not in $(...): a subshell cannot wait for our children).
wait_exit() {
    local pid=$1 secs=$2 i
    RC=0
    for ((i = 0; i < secs * 10; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then RC=255; return; fi
    wait "$pid" || RC=$?
}

health() { curl -s -o /dev/null -w '%{http_code}' --max-time 1 http://10.79.1.2:8000/health || true; }

wait_healthy() { # SECS
    local i
    for ((i = 0; i < $1 * 10; i++)); do
        [[ $(health) == 200 ]] && return 0
        sleep 0.1
    done
    return 1
}

stop() { local p; for p in "$@"; do kill -9 "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; }

PLAN=$TMP/plan.json
MODEL=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["ranks"][0]["argv"][2])' "$PLAN" | sed "s/<COMMIT>/$COMMIT/")

# --- 1. a healthy group --------------------------------------------------------
echo "# 1. the plan's two ranks form a group over the fabric and serve"
start head 1 "$PLAN" 0
H=$LAST
start worker 2 "$PLAN" 1
W=$LAST
check "API /health is 200 through 10.79.1.2:8000 (management net)" wait_healthy 30
check "the worker joined from its fabric address" grep -q 'node rank 1 joined from 10.80.0.2 (10.80.0.2:' "$TMP/head.out"
body=$(curl -s --max-time 5 http://10.79.1.2:8000/v1/completions -H 'Content-Type: application/json' \
    -d "{\"model\": \"$MODEL\", \"prompt\": \"Hello there\", \"max_tokens\": 8}")
check "POST /v1/completions answers a text_completion of 8 tokens" python3 -c '
import json, sys
d = json.loads(sys.argv[1])
assert d["object"] == "text_completion" and d["choices"][0]["finish_reason"] == "length", d
assert d["usage"]["completion_tokens"] == 8 and d["usage"]["prompt_tokens"] == 2, d
' "$body"
code=$(curl -s -o "$TMP/404.json" -w '%{http_code}' --max-time 5 http://10.79.1.2:8000/v1/completions \
    -H 'Content-Type: application/json' -d '{"model": "nope", "prompt": "x", "max_tokens": 1}')
check "a wrong model name is a 404 'does not exist'" grep -qF "The model \`nope\` does not exist." "$TMP/404.json"
[[ $code == 404 ]] || fail "wrong model: HTTP $code"
check "both ranks recorded ok=true in STANDIN_OUT" python3 -c '
import glob, json, sys
docs = [json.load(open(f)) for f in glob.glob(sys.argv[1] + "/*-vllm-*.json")]
assert len(docs) == 2 and all(d["ok"] for d in docs), docs
assert {d["node"] for d in docs} == {"n1", "n2"}, docs
' "$TMP/out"
kill -TERM "$W" || true
wait_exit "$H" 20; rc=$RC
check "SIGTERM on the worker takes the head down (head exit $rc)" test "$rc" = 1
wait_exit "$W" 5; rc=$RC
check "the worker exits on SIGTERM (exit $rc)" test "$rc" = 0
stop "$H" "$W"

# --- 2. a crash takes the group down --------------------------------------
echo "# 2. STANDIN_CRASH_RANK=1: the crashed rank exits 17, the head follows"
rm -rf "$TMP/out"
start head 1 "$PLAN" 0 STANDIN_CRASH_RANK=1 STANDIN_CRASH_AFTER=2
H=$LAST
start worker 2 "$PLAN" 1 STANDIN_CRASH_RANK=1 STANDIN_CRASH_AFTER=2
W=$LAST
check "healthy before the crash" wait_healthy 30
wait_exit "$W" 20; rcw=$RC
wait_exit "$H" 20; rch=$RC
check "the crashed rank exits 17 (got $rcw)" test "$rcw" = 17
check "the head exits non-zero (got $rch)" test "$rch" != 0 -a "$rch" != 255
check "the NCCL error is on the crashed rank's stderr" \
    grep -q 'RuntimeError: NCCL error: unhandled system error' "$TMP/worker.err"
stop "$H" "$W"

echo "# 2b. STANDIN_CRASH_RANK=0: the head crashes, the worker loses it"
start head 1 "$PLAN" 0 STANDIN_CRASH_RANK=0
H=$LAST
start worker 2 "$PLAN" 1 STANDIN_CRASH_RANK=0
W=$LAST
wait_exit "$H" 30; rch=$RC
wait_exit "$W" 20; rcw=$RC
check "head exits 17 (got $rch), worker non-zero (got $rcw)" test "$rch" = 17 -a "$rcw" != 0 -a "$rcw" != 255
check "the worker says it lost the head" grep -q 'lost the head' "$TMP/worker.err"
stop "$H" "$W"

# --- 3. a hang: never joins, ignores SIGTERM ---------------------------------
echo "# 3. STANDIN_HANG_RANK=1: no API, the hung rank survives SIGTERM"
start head 1 "$PLAN" 0 STANDIN_HANG_RANK=1
H=$LAST
start worker 2 "$PLAN" 1 STANDIN_HANG_RANK=1
W=$LAST
sleep 3
check "no API while a rank hangs" test "$(health)" != 200
check "the hung rank printed its NCCL line" grep -q 'NCCL INFO NET/Socket : Using' "$TMP/worker.out"
kill -TERM "$W" || true
sleep 1
check "the hung rank is still alive after SIGTERM" kill -0 "$W"
kill -TERM "$H" || true
wait_exit "$H" 5
check "the waiting head exits 0 on SIGTERM" test "$RC" = 0
stop "$H" "$W"

# --- 4. mismatches ----------------------------------------------------------
echo "# 4. a rank off its plan exits 3 with MISMATCH"
start worker 2 "$PLAN" 1 NCCL_SOCKET_IFNAME==mgmt0
W=$LAST
wait_exit "$W" 10
check "wrong NCCL_SOCKET_IFNAME: exit 3" test "$RC" = 3
check "wrong NCCL_SOCKET_IFNAME: one MISMATCH line naming it" \
    grep -q '^standin: MISMATCH: .*NCCL_SOCKET_IFNAME' "$TMP/worker.err"
# A plan that is self-consistent but names the other node's interface (the
# cross-wiring mistake): the interface check, not the env check, catches it.
python3 - "$PLAN" "$TMP/crossed.json" <<'EOF'
import json, sys
p = json.load(open(sys.argv[1]))
p["ranks"][1]["env"].update(NCCL_SOCKET_IFNAME="=fab0", GLOO_SOCKET_IFNAME="fab0")
json.dump(p, open(sys.argv[2], "w"))
EOF
start worker 2 "$TMP/crossed.json" 1
W=$LAST
wait_exit "$W" 10
check "the other node's interface name: exit 3" test "$RC" = 3
check "... MISMATCH says fab0 does not exist on n2" grep -q "^standin: MISMATCH: .*'fab0', which does not exist" "$TMP/worker.err"
start worker 2 "$PLAN" 1 GLOO_SOCKET_IFNAME==enp1s0f1
W=$LAST
wait_exit "$W" 10
check "GLOO_SOCKET_IFNAME with a '=': exit 3" test "$RC" = 3
rm -rf "$MODEL_DIR"
start worker 2 "$PLAN" 1
W=$LAST
wait_exit "$W" 10
check "a missing model directory: exit 3" test "$RC" = 3
check "... MISMATCH names the model path" grep -q '^standin: MISMATCH: model path .* is not a directory' "$TMP/worker.err"
check "the mismatching rank recorded ok=false" python3 -c '
import glob, json, sys
assert any(not json.load(open(f))["ok"] for f in glob.glob(sys.argv[1] + "/n2-vllm-*.json"))
' "$TMP/out"

echo
if ((FAILS)); then
    echo "selfcheck: $FAILS check(s) FAILED"
    exit 1
fi
echo "selfcheck: all checks passed"
