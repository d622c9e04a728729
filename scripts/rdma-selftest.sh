#!/usr/bin/env bash
# RDMA self-test on two real hosts: run by hand, over ssh. It has never run
# on the development machine (no RDMA NIC, no kernel RDMA support there);
# scripts/test.sh only compiles and lints the RDMA backend.
#
#   scripts/rdma-selftest.sh HOST_A HOST_B
#
# HOST_A and HOST_B are ssh destinations ([USER@]HOST) of two machines with
# an RDMA NIC (RoCE or InfiniBand) on the same fabric, the rdma-core runtime
# (libibverbs1, the provider of the NIC) and perftest (ib_write_bw). This
# machine builds xfer with `--features rdma` (needs cargo, libibverbs-dev,
# librdmacm-dev, libclang-dev and jq) and copies the binaries to both hosts.
#
#   1. the hardware unit test (loopback_write_imm in
#      xfer/src/transport/rdma/sys.rs) on A and on B;
#   2. ib_write_bw, server on B and client on A, 4 MiB messages over 4 QPs
#      for IBBW_SECS seconds: the reference;
#   3. xfer push of a generated SIZE_GIB GiB tree from A to an agent on B,
#      both with --transport rdma; goodput = bytes_total*8/(duration_s -
#      hash_s)/1e9 Gb/s, from the push's --json summary;
#   4. prints `xfer / ib_write_bw = R` against TARGET. Exit 0 when R >=
#      TARGET, 1 when below or when a step failed.
#
# Environment (defaults in brackets):
#   B_ADDR [HOST_B without USER@]  B's address on the RDMA fabric, as A reaches
#                          it (ib_write_bw's control connection, xfer's QUIC)
#   RDMA_DEVICE []         device on both hosts, e.g. mlx5_0 (default: the
#                          first one); passed as XFER_RDMA_DEVICE and -d
#   RDMA_PORT [1]          port of that device; XFER_RDMA_PORT and -i
#   RDMA_GID_INDEX []      GID index (RoCE v2: an IPv4 GID, see show_gids);
#                          XFER_RDMA_GID_INDEX and -x (default: 0 for the
#                          unit test, ib_write_bw's own choice)
#   SIZE_GIB [8]           size of the pushed tree
#   IBBW_SECS [10]         ib_write_bw duration
#   TARGET [0.9]           the ratio to reach
#   XPORT [7470]           UDP port of the agent on B
#   IBBW_PORT [18515]      TCP port of ib_write_bw's control connection
#   REMOTE_DIR [/var/tmp/xfer-rdma-selftest]  scratch on both hosts (the
#                          source tree on A is kept there for the next run;
#                          the copy on B is removed on exit)
#   SSH_OPTS []            extra ssh options, e.g. "-p 2222"

set -euo pipefail
shopt -s inherit_errexit
export LC_ALL=C

usage() { sed -n '2,41p' "$0" | sed 's/^# \{0,1\}//'; }
log() { printf '[rdma-selftest %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

case ${1:-} in
-h | --help | help)
    usage
    exit 0
    ;;
esac
if [ $# -ne 2 ]; then
    usage >&2
    exit 2
fi
HOST_A=$1
HOST_B=$2
B_ADDR=${B_ADDR:-${HOST_B#*@}}
RDMA_DEVICE=${RDMA_DEVICE:-}
RDMA_PORT=${RDMA_PORT:-1}
RDMA_GID_INDEX=${RDMA_GID_INDEX:-}
SIZE_GIB=${SIZE_GIB:-8}
IBBW_SECS=${IBBW_SECS:-10}
TARGET=${TARGET:-0.9}
XPORT=${XPORT:-7470}
IBBW_PORT=${IBBW_PORT:-18515}
REMOTE_DIR=${REMOTE_DIR:-/var/tmp/xfer-rdma-selftest}
read -r -a SSH_EXTRA <<<"${SSH_OPTS:-}"

for v in RDMA_PORT SIZE_GIB IBBW_SECS XPORT IBBW_PORT; do
    [[ ${!v} =~ ^[0-9]+$ && ${!v} -ge 1 ]] || die "$v must be a positive integer, not '${!v}'"
done
[[ -z $RDMA_GID_INDEX || $RDMA_GID_INDEX =~ ^[0-9]+$ ]] || die "RDMA_GID_INDEX must be a number"
[[ $TARGET =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "TARGET must be a number, e.g. 0.9"
[[ $REMOTE_DIR == /* && $REMOTE_DIR != / ]] || die "REMOTE_DIR must be an absolute path other than /"
for c in cargo jq ssh scp awk; do
    command -v "$c" >/dev/null || die "$c not found on this machine"
done

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPT_DIR/.." && pwd)
LOCAL=$(mktemp -d)

ssh_to() { # ssh_to HOST COMMAND...: one remote shell command, no prompts
    local host=$1
    shift
    ssh -o BatchMode=yes -o ConnectTimeout=10 "${SSH_EXTRA[@]}" "$host" "$@"
}
# The XFER_RDMA_* variables for remote commands (xfer and the unit test).
RENV="XFER_RDMA_PORT=$RDMA_PORT"
[ -z "$RDMA_DEVICE" ] || RENV+=" XFER_RDMA_DEVICE=$RDMA_DEVICE"
[ -z "$RDMA_GID_INDEX" ] || RENV+=" XFER_RDMA_GID_INDEX=$RDMA_GID_INDEX"
IBBW_ARGS=(-s 4194304 -q 4 -D "$IBBW_SECS" --report_gbits -i "$RDMA_PORT" -p "$IBBW_PORT")
[ -z "$RDMA_DEVICE" ] || IBBW_ARGS+=(-d "$RDMA_DEVICE")
[ -z "$RDMA_GID_INDEX" ] || IBBW_ARGS+=(-x "$RDMA_GID_INDEX")

cleanup() {
    local rc=$?
    set +e
    trap - EXIT INT TERM
    # Only what this script started, by the PIDs it recorded.
    ssh_to "$HOST_B" "cd $REMOTE_DIR 2>/dev/null && for f in agent.pid; do [ -f \$f ] && kill \$(cat \$f) 2>/dev/null; rm -f \$f; done; rm -rf dst" 2>/dev/null
    rm -rf "$LOCAL"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---------------------------------------------------------------- checks ----

for h in "$HOST_A" "$HOST_B"; do
    out=$(ssh_to "$h" true 2>&1) || die "cannot ssh to $h: $(tail -n1 <<<"$out") (logins must not prompt: BatchMode)"
    ssh_to "$h" 'command -v ib_write_bw >/dev/null' || die "$h has no ib_write_bw: install perftest there"
    ssh_to "$h" 'ls /sys/class/infiniband/ 2>/dev/null | grep -q .' ||
        die "$h has no RDMA device in /sys/class/infiniband (kernel RDMA support and the NIC's RDMA driver loaded?)"
done

# ---------------------------------------------------------------- build ----

log "building xfer --features rdma (release) and the unit-test binary"
TARGET_DIR=${CARGO_TARGET_DIR:-$REPO/target}
(cd "$REPO" && cargo build --release -p xfer --features rdma >&2) || die "cargo build --features rdma failed"
TEST_BIN=$(cd "$REPO" && cargo test --release -p xfer --features rdma --lib --no-run --message-format=json 2>/dev/null |
    jq -r 'select(.profile.test == true and .target.kind == ["lib"]) | .executable' | tail -n1)
[ -x "$TEST_BIN" ] || die "could not find the xfer unit-test binary (cargo test --no-run)"
cp "$TARGET_DIR/release/xfer" "$LOCAL/xfer"
cp "$TEST_BIN" "$LOCAL/xfer-unit"
"$LOCAL/xfer" keygen --out "$LOCAL/cluster.key" >/dev/null
for h in "$HOST_A" "$HOST_B"; do
    ssh_to "$h" "mkdir -p $REMOTE_DIR" || die "cannot create $REMOTE_DIR on $h"
    scp -q -o BatchMode=yes "${SSH_EXTRA[@]}" "$LOCAL/xfer" "$LOCAL/xfer-unit" "$LOCAL/cluster.key" "$h:$REMOTE_DIR/" ||
        die "copying the binaries to $h failed"
    ssh_to "$h" "$REMOTE_DIR/xfer --version >/dev/null" ||
        die "xfer does not run on $h (libibverbs1 missing, or an older glibc than this machine's?)"
done

# ---------------------------------------------------------------- 1. unit test ----

for h in "$HOST_A" "$HOST_B"; do
    log "hardware test on $h: loopback WRITE_WITH_IMM"
    ssh_to "$h" "cd $REMOTE_DIR && env $RENV ./xfer-unit --ignored --exact transport::rdma::sys::tests::loopback_write_imm --nocapture" >&2 ||
        die "the loopback hardware test failed on $h (output above)"
done

# ---------------------------------------------------------------- 2. ib_write_bw ----

log "ib_write_bw: server on $HOST_B, client on $HOST_A, ${IBBW_SECS}s, 4 MiB x 4 QPs"
ssh_to "$HOST_B" "timeout $((IBBW_SECS + 60)) ib_write_bw ${IBBW_ARGS[*]}" >"$LOCAL/ibbw-server.log" 2>&1 &
server=$!
sleep 3
rc=0
ssh_to "$HOST_A" "timeout $((IBBW_SECS + 60)) ib_write_bw ${IBBW_ARGS[*]} $B_ADDR" >"$LOCAL/ibbw-client.log" 2>&1 || rc=$?
wait "$server" || true
[ "$rc" = 0 ] || die "ib_write_bw client on $HOST_A exited $rc: $(tail -n3 "$LOCAL/ibbw-client.log" | tr '\n' ' ')"
# The result line: #bytes #iterations BW-peak BW-average MsgRate.
IBBW=$(awk '$1 == 4194304 && NF >= 4 { v = $4 } END { if (v != "") print v }' "$LOCAL/ibbw-client.log")
[[ $IBBW =~ ^[0-9.]+$ ]] || die "no result line in ib_write_bw's output: $(tail -n5 "$LOCAL/ibbw-client.log" | tr '\n' ' ')"
log "ib_write_bw: $IBBW Gb/s"

# ---------------------------------------------------------------- 3. xfer push ----

SRC=$REMOTE_DIR/src-${SIZE_GIB}G/model
log "source tree of $SIZE_GIB GiB on $HOST_A ($SRC; kept for the next run)"
ssh_to "$HOST_A" "set -e
    if [ ! -f $SRC/.complete ]; then
        rm -rf $SRC && mkdir -p $SRC
        avail=\$(df -Pk $REMOTE_DIR | awk 'NR == 2 { print \$4 }')
        [ \"\$avail\" -gt $((SIZE_GIB * 1100 * 1024)) ] || { echo 'not enough space for the tree in $REMOTE_DIR' >&2; exit 1; }
        for i in 1 2 3 4; do
            head -c \$(( ($SIZE_GIB << 28) + i * 4099 )) /dev/urandom >$SRC/model-0000\$i-of-00004.safetensors
        done
        printf '{\"hidden_size\": 4096}\n' >$SRC/config.json
        touch $SRC/.complete
    fi" || die "generating the source tree on $HOST_A failed"

log "agent on $HOST_B: xfer serve --transport rdma on :$XPORT"
ssh_to "$HOST_B" "cd $REMOTE_DIR && rm -rf dst agent.log && mkdir dst &&
    { env $RENV nohup ./xfer serve --transport rdma --listen 0.0.0.0:$XPORT --root $REMOTE_DIR/dst --key $REMOTE_DIR/cluster.key >agent.log 2>&1 </dev/null & echo \$! >agent.pid; }" ||
    die "starting the agent on $HOST_B failed"
for ((i = 0; i < 100; i++)); do
    if ssh_to "$HOST_B" "grep -q 'xfer agent listening' $REMOTE_DIR/agent.log"; then break; fi
    ssh_to "$HOST_B" "kill -0 \$(cat $REMOTE_DIR/agent.pid) 2>/dev/null" ||
        die "the agent on $HOST_B exited at start: $(ssh_to "$HOST_B" "tail -n3 $REMOTE_DIR/agent.log" | tr '\n' ' ')"
    sleep 0.2
done
[ "$i" -lt 100 ] || die "the agent on $HOST_B did not report listening within 20 s"

log "xfer push from $HOST_A to $B_ADDR:$XPORT --transport rdma"
rc=0
ssh_to "$HOST_A" "cd $REMOTE_DIR && XDG_CACHE_HOME=$REMOTE_DIR/cache env $RENV ./xfer push $SRC --to $B_ADDR:$XPORT --key $REMOTE_DIR/cluster.key --name model --rehash --json --transport rdma" \
    >"$LOCAL/push.json" 2>"$LOCAL/push.err" || rc=$?
[ "$rc" = 0 ] || die "xfer push exited $rc: $(tail -n3 "$LOCAL/push.err" | tr '\n' ' ')"
read -r BYTES DUR HASH OK < <(jq -r '[.bytes_total, .duration_s, .hash_s, ([.nodes[].ok] | all)] | @tsv' "$LOCAL/push.json") ||
    die "unreadable push summary: $(head -c 300 "$LOCAL/push.json")"
[ "$OK" = true ] || die "the push reports a failed node: $(jq -c '[.nodes[] | select(.ok | not) | .error]' "$LOCAL/push.json")"
RDMA_BYTES=$(jq -r '[.nodes[].bytes_sent_rdma] | add' "$LOCAL/push.json")
SENT_BYTES=$(jq -r '[.nodes[].bytes_sent] | add' "$LOCAL/push.json")
log "of $SENT_BYTES bytes sent, $RDMA_BYTES went by RDMA write"
[ "$RDMA_BYTES" = "$SENT_BYTES" ] || die "only $RDMA_BYTES of $SENT_BYTES bytes went by RDMA (the rest fell back to QUIC); see the agent's log on $HOST_B and the push's stderr: $(grep -m1 'rdma:' "$LOCAL/push.err" || true)"
XFER_GBPS=$(awk -v b="$BYTES" -v d="$DUR" -v h="$HASH" 'BEGIN { s = d - h; if (s <= 0) print "n/a"; else printf "%.2f", b * 8 / s / 1e9 }')
[ "$XFER_GBPS" != n/a ] || die "push duration_s $DUR is not above hash_s $HASH"
log "xfer: $BYTES bytes in ${DUR}s (hashing ${HASH}s): $XFER_GBPS Gb/s"

# ---------------------------------------------------------------- 4. verdict ----

R=$(awk -v x="$XFER_GBPS" -v i="$IBBW" 'BEGIN { printf "%.2f", x / i }')
echo "ib_write_bw: $IBBW Gb/s; xfer push --transport rdma: $XFER_GBPS Gb/s"
echo "xfer / ib_write_bw = $R (target $TARGET)"
awk -v r="$R" -v t="$TARGET" 'BEGIN { exit !(r >= t) }' || {
    log "below the target"
    exit 1
}
