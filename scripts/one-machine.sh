#!/usr/bin/env bash
# The quick start on one machine (docs/one-machine.md), run for real from a
# clean folder: a Hub look-alike (`xfer hub-serve`), two agents on
# 127.0.0.2 and 127.0.0.3, a Hub repo synced to both, `xfer-launch deploy`
# of a stand-in engine (tests/standin: no GPU, no vLLM) that answers a
# completion, a re-sync that moves nothing, a sync against the Hub stopped
# (it gives up), and a cancel.
# Prints every command with `$ ` before it and what it printed: the
# transcript in docs/one-machine.md is this script's output.
#
#   scripts/one-machine.sh [DIR]      (default /tmp/xfer-one-machine)
#
# Env: XFER_BIN_DIR [target/release, else target/debug]: where `xfer` is.
# Ports: 8088 (TCP, the Hub look-alike), 7470 (UDP, the agents), 18000
# and 29577 (TCP, the engine's API and rendezvous).
# Needs `unshare` (util-linux) and root, or unprivileged user namespaces.

set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=${1:-/tmp/xfer-one-machine}
BIN=${XFER_BIN_DIR:-$REPO/target/release}
[ -x "$BIN/xfer" ] || BIN=$REPO/target/debug
[ -x "$BIN/xfer" ] || { echo "no xfer binary: run cargo build --release first" >&2; exit 1; }
[ -x "$BIN/xfer-launch" ] || { echo "no xfer-launch binary in $BIN: run cargo build --release first" >&2; exit 1; }
# A mount namespace per agent: as root, or in a user namespace of our own.
UNSHARE="unshare --mount --propagation private"
[ "$(id -u)" = 0 ] || UNSHARE="unshare --user --map-root-user --mount --propagation private"
$UNSHARE true 2>/dev/null || { echo "cannot make a mount namespace ($UNSHARE true failed): run as root, or allow unprivileged user namespaces" >&2; exit 1; }
export PATH=$BIN:$PATH
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

# show CMD...: prints `$ CMD` and runs it (its exit code printed if not 0).
show() {
    printf '$ %s\n' "$*"
    set +e
    eval "$@" 2>&1 | sed -E 's/[0-9]+\.[0-9]+s\b/N.NNs/g'
    local rc=${PIPESTATUS[0]}
    set -e
    [ "$rc" = 0 ] || printf '(exit %s)\n' "$rc"
}
# wait_for FILE WORD: until FILE contains WORD (a started server's line).
wait_for() {
    for _ in $(seq 300); do grep -q "$2" "$1" 2>/dev/null && return; sleep 0.1; done
    echo "timed out waiting for $2 in $1" >&2; exit 1
}

rm -rf "$DIR" && mkdir -p "$DIR" && cd "$DIR"
echo '# 1. A model to serve: any folder (here 64 MiB of random "weights" and a config).'
show 'mkdir model && head -c 64M /dev/urandom >model/model.safetensors && echo "{\"architectures\": [\"Demo\"]}" >model/config.json'
echo
echo '# 2. A Hub look-alike serving it as acme/tiny (in the background; Ctrl-C or kill stops it).'
printf '$ %s\n' 'xfer hub-serve model --repo acme/tiny --listen 127.0.0.1:8088 >hub.log &'
xfer hub-serve model --repo acme/tiny --listen 127.0.0.1:8088 >hub.log 2>&1 &
PIDS+=($!)
HUB=$!
wait_for hub.log 'use it with'
show cat hub.log
echo
echo '# 3. A cluster key and two agents. On one machine the nodes differ by address'
echo '#    (127.0.0.2 and 127.0.0.3, both loopback), and each has its own folder'
echo '#    (node-a, node-b) that it sees at one path, models/, in a mount namespace'
echo '#    of its own: an engine wants the weights at one path on every node.'
echo '#    --allow-launch lets the agents start the engine.'
show 'xfer keygen --out cluster.key'
show 'mkdir -m 755 node-a node-b models'
for n in a b; do
    ip=127.0.0.2
    [ $n = b ] && ip=127.0.0.3
    printf '$ %s\n' "HF_ENDPOINT=http://127.0.0.1:8088 $UNSHARE sh -c 'mount --bind node-$n models && exec xfer serve --listen $ip:7470 --root \$PWD/models --key cluster.key --allow-launch' >agent-$n.log 2>&1 &"
    HF_ENDPOINT=http://127.0.0.1:8088 $UNSHARE sh -c "mount --bind node-$n models && exec xfer serve --listen $ip:7470 --root \$PWD/models --key cluster.key --allow-launch" >"agent-$n.log" 2>&1 &
    PIDS+=($!)
done
wait_for agent-a.log 'listening'
wait_for agent-b.log 'listening'
cat >cluster.toml <<EOF
key = "cluster.key"

[[node]]
name = "node-a"
agent = "127.0.0.2:7470"
root = "$DIR/models"
fabric_if = "lo"
fabric_ip = "127.0.0.2"

[[node]]
name = "node-b"
agent = "127.0.0.3:7470"
root = "$DIR/models"
fabric_if = "lo"
fabric_ip = "127.0.0.3"

[launch]
engine = "custom"
model = "acme/tiny"
api_port = 18000
master_port = 29577
template = "python3 $REPO/tests/standin/engine.py custom --rank {rank} --nnodes {nnodes} --head-ip {head_ip} --port {master_port} --api-port {api_port} --model {model}"
EOF
show cat cluster.toml
show 'export XFER_CLUSTER=$PWD/cluster.toml HF_ENDPOINT=http://127.0.0.1:8088'
export XFER_CLUSTER=$DIR/cluster.toml HF_ENDPOINT=http://127.0.0.1:8088
echo
echo '# 4. The repo to both nodes: node-a pulls it once, node-b gets it from node-a.'
show 'xfer sync acme/tiny --from node-a --wait'
show 'xfer status'
show 'ls node-b/models--acme--tiny/snapshots/*/'
echo
echo '# 5. The job: deploy the model on both nodes (a stand-in engine here: no GPU, no'
echo '#    vLLM). It checks every node, syncs where the model is missing (nothing here),'
echo '#    starts the ranks on the fabric addresses and waits for the first completion.'
show 'xfer-launch deploy'
show "curl -s 127.0.0.2:18000/v1/models; echo"
show 'xfer-launch down'
echo
echo '# 6. Day two. The same revision again: nothing moves, the model stays complete.'
show 'xfer sync acme/tiny --from node-a --wait'
echo
echo '# 7. The Hub goes away: the sync retries, then gives up with the cause;'
echo '#    the model the nodes hold stays complete.'
kill "$HUB"
wait "$HUB" 2>/dev/null || true
show 'xfer sync acme/tiny --from node-a --wait --give-up-after 5s'
show 'xfer status'
echo
echo '# 8. A sync that would retry for ever, then cancelled: status exits 1 while it'
echo '#    retries, and the model is still complete after the cancel.'
printf '$ %s\n' 'JOB=$(xfer sync acme/tiny --from node-a --give-up-after never 2>/dev/null); echo $JOB'
JOB=$(xfer sync acme/tiny --from node-a --give-up-after never 2>/dev/null)
echo "$JOB"
for _ in $(seq 300); do xfer status 2>/dev/null | grep -q 'retrying (attempt' && break; sleep 0.1; done
show 'xfer status'
show 'xfer cancel $JOB'
for _ in $(seq 100); do xfer status --json 2>/dev/null | grep -q '"cancelled"' && break; sleep 0.1; done
show 'xfer prune && xfer status'
