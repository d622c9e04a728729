#!/usr/bin/env bash
# xfer in place of sbcast, inside the same real Slurm allocation (issue 56).
#
#   scripts/bench-slurm.sh
#
# A Slurm lab (scripts/slurmlab.sh): NODES nodes, fabric links shaped to
# FABRIC_MBIT both ways (Slurm's NodeAddr, so sbcast and srun take it),
# management at MGMT_MBIT, every node with its own local disk; an xfer
# agent on every node as systemd would run it. The model: 4 shards of
# SIZE_MB/4 and a few small files, on the shared file system. Then, RUNS
# times, alternating, one job each on the same NODES-node allocation:
#   sbcast  `srun mkdir` + `sbcast -f FILE /local/sbcast/FILE` for every file
#           (a loop: one file per call, as users write it)
#   xfer    `xfer push MODEL --cluster cluster.toml` (the job's hosts are the
#           nodes: the cluster file has only a [slurm] template)
# Each is timed inside its job script, so Slurm's scheduling is not counted
# for either. Printed per run: time / (S/B) where S is the model and B the
# fabric rate, the batch host's fabric upload / S (tc's counter), and
# whether every node's copy is byte-identical to the source (b3sum).
# Between runs every copy is removed (`xfer rm` for xfer's).
#
# Env: NODES [4], FABRIC_MBIT [400], MGMT_MBIT [100], SIZE_MB [512],
# RUNS [2], XFER [build target/release/xfer], PREFIX [xsbn], KEEP_RUN [0]
# (1 keeps the scratch folder: job outputs, push summaries, agent logs).
# For xfer, the push's own split is printed too: hashing the source (the
# first push of a model only; later pushes read the hash cache) and the
# rest.
set -euo pipefail
cd "$(dirname "$0")/.."
LOG_TAG=bench-slurm
# shellcheck source=lib-bench.sh
source scripts/lib-bench.sh

NODES=${NODES:-4}
FABRIC_MBIT=${FABRIC_MBIT:-400}
MGMT_MBIT=${MGMT_MBIT:-100}
SIZE_MB=${SIZE_MB:-512}
RUNS=${RUNS:-2}
export PREFIX=${PREFIX:-xsbn}
LAB=scripts/slurmlab.sh
NET=scripts/netcluster.sh

if [[ -z ${XFER:-} ]]; then
    cargo build -q --release -p xfer
    XFER=$PWD/target/release/xfer
fi
need b3sum b3sum
need sbcast slurm-client
need slurmd slurmd
need slurmctld slurmctld
need munged munge

T=$(mktemp -d /var/tmp/xfer-bench-slurm.XXXXXX)
cleanup() {
    stop_all
    $LAB down >/dev/null 2>&1 || true
    if [[ ${KEEP_RUN:-0} == 1 ]]; then log "kept $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT

log "lab: $NODES nodes, fabric $FABRIC_MBIT Mbit/s, management $MGMT_MBIT Mbit/s"
$LAB up "$NODES" "$MGMT_MBIT" "$FABRIC_MBIT" >&2
DIR=$($LAB dir)
LOCAL=$DIR/local

# The model: 4 shards and small files, flat (sbcast takes one file per call).
SRC=$T/src/model
mkdir -p "$SRC"
shard=$((SIZE_MB / 4))
for k in 1 2 3 4; do
    head -c "$((shard * 1024 * 1024))" /dev/urandom >"$SRC/model-0000$k-of-00004.safetensors"
done
for f in config.json generation_config.json tokenizer.json tokenizer_config.json special_tokens_map.json model.safetensors.index.json; do
    head -c $((RANDOM * 8 + 512)) /dev/urandom | base64 >"$SRC/$f"
done
S=$(du -sb "$SRC" | awk '{print $1}')
cat "$SRC"/* >/dev/null # in the page cache for both tools
(cd "$SRC" && b3sum -- * | sort -k2) >"$T/src.b3"

"$XFER" keygen --out "$T/cluster.key" >/dev/null
cat >"$T/cluster.toml" <<EOF
key = "cluster.key"

[slurm]
agent = "{host}:7470"
root = "$LOCAL/xfer"
fabric_if = "eth1"
fabric_ip = "{host}-fab"
EOF

for i in $(seq 1 "$NODES"); do
    mkdir -p "$($LAB disk "$i")/xfer"
    $LAB exec "$i" "$XFER" serve --listen 0.0.0.0:7470 --root "$LOCAL/xfer" --key "$T/cluster.key" \
        >"$T/agent-$i.out" 2>"$T/agent-$i.log" &
    track $!
done
for i in $(seq 1 "$NODES"); do
    for _ in $(seq 100); do grep -q "listening" "$T/agent-$i.out" && break; sleep 0.1; done
    grep -q "listening" "$T/agent-$i.out" || die "agent $i did not start: $(tail -3 "$T/agent-$i.log")"
done

cat >"$T/sbcast.sbatch" <<EOF
#!/bin/bash
set -euo pipefail
t0=\$(date +%s.%N)
srun --ntasks-per-node=1 mkdir -p $LOCAL/sbcast/model
for f in $SRC/*; do sbcast -f "\$f" "$LOCAL/sbcast/model/\$(basename "\$f")"; done
t1=\$(date +%s.%N)
echo "seconds \$(echo "\$t1 - \$t0" | bc -l)"
EOF
cat >"$T/xfer.sbatch" <<EOF
#!/bin/bash
set -euo pipefail
t0=\$(date +%s.%N)
XDG_CACHE_HOME=$T/xdg $XFER push $SRC --cluster $T/cluster.toml --json > $T/push-\$SLURM_JOB_ID.json
t1=\$(date +%s.%N)
echo "seconds \$(echo "\$t1 - \$t0" | bc -l)"
EOF
need bc bc

# run_job TOOL: one job on the whole allocation; prints "SECONDS UPLOAD_BYTES".
run_job() {
    local tool=$1 id up0 up1 state
    up0=$($NET bytes 1 eth1 up)
    id=$($LAB exec 0 sbatch --parsable --nodes="$NODES" --output "$T/$tool-%j.out" "$T/$tool.sbatch")
    for _ in $(seq 3000); do
        state=$($LAB exec 0 scontrol show job -o "$id" | tr ' ' '\n' | sed -n 's/^JobState=//p')
        case $state in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL) break ;; esac
        sleep 0.2
    done
    [[ $state == COMPLETED ]] || die "$tool job $id: $state: $(tail -5 "$T/$tool-$id.out")"
    up1=$($NET bytes 1 eth1 up)
    local hash=-
    [[ $tool == xfer ]] && hash=$(python3 -c 'import json,sys; print("%.2f" % json.load(open(sys.argv[1]))["hash_s"])' "$T/push-$id.json")
    echo "$(sed -n 's/^seconds //p' "$T/$tool-$id.out") $((up1 - up0)) $hash"
}

# same_everywhere SUBDIR: every node's copy is byte-identical to the source.
same_everywhere() {
    local i ok=yes
    for i in $(seq 1 "$NODES"); do
        (cd "$($LAB disk "$i")/$1" && b3sum -- * | sort -k2) | cmp -s - "$T/src.b3" || ok="NO (node $i)"
    done
    echo "$ok"
}

sb=$(echo "$S * 8 / ($FABRIC_MBIT * 1000000)" | bc -l)
printf 'S = %d bytes, B = %d Mbit/s, S/B = %.2f s, %d nodes\n' "$S" "$FABRIC_MBIT" "$sb" "$NODES"
printf '%-7s %4s %9s %8s %10s %8s %s\n' tool run seconds "x S/B" "upload/S" "hash s" identical
for r in $(seq 1 "$RUNS"); do
    for tool in sbcast xfer; do
        read -r secs up hash < <(run_job "$tool")
        if [[ $tool == sbcast ]]; then
            same=$(same_everywhere sbcast/model)
            for i in $(seq 1 "$NODES"); do rm -rf "$($LAB disk "$i")/sbcast"; done
        else
            same=$(same_everywhere xfer/model)
            $LAB exec 1 env SLURM_JOB_NODELIST="$PREFIX-n[1-$NODES]" "$XFER" rm model --cluster "$T/cluster.toml" --yes >/dev/null
        fi
        printf '%-7s %4d %9.2f %8.2f %10.2f %8s %s\n' "$tool" "$r" "$secs" "$(echo "$secs / $sb" | bc -l)" "$(echo "$up / $S" | bc -l)" "$hash" "$same"
    done
done
