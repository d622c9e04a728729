#!/usr/bin/env bash
# A real Slurm cluster on one machine, for tests and benchmarks: Debian's
# slurmctld, slurmd and munged over the shaped hosts of netcluster.sh.
#
#   scripts/slurmlab.sh up N MGMT_MBIT FABRIC_MBIT   hosts 0..N; replaces an old lab
#   scripts/slurmlab.sh down                        stop the daemons, remove the hosts
#   scripts/slurmlab.sh exec I CMD...               run CMD on host I (as a login shell
#                                                   there would: SLURM_CONF set, the lab's
#                                                   names resolving, its own host name)
#   scripts/slurmlab.sh name I                      host I's Slurm name ($PREFIX-n$I)
#   scripts/slurmlab.sh dir                         where the lab keeps its state and logs
#   scripts/slurmlab.sh disk I                      host I's local disk, as the machine sees it
#
#   host 0 ($PREFIX-n0)   slurmctld: the controller, and the login host jobs are submitted from
#   host i ($PREFIX-ni)   slurmd -N $PREFIX-ni, its own host name (a UTS namespace)
#   eth0 $MGMT_NET.(i+1)    the management network, MGMT_MBIT (xfer's agents listen here)
#   eth1 $FABRIC_NET.(i+1)  the fabric, FABRIC_MBIT: Slurm's NodeAddr, so srun, sbcast
#                           and xfer's data all take it
#
# Local disks: every host sees its own folder at $DIR/local (the lab's
# $DIR/disks/NAME, bound there in the host's mount namespace), as every
# node of a real cluster has its own /local NVMe: `sbcast FILE
# $DIR/local/...` and a cluster file's `root = "$DIR/local/xfer"` land on
# each node's own disk.
# Names: every host resolves $PREFIX-ni to its management address and
# $PREFIX-ni-fab to its fabric address (/etc/netns/HOST/hosts, which `ip
# netns exec` mounts over /etc/hosts), so a cluster file's [slurm] table
# reads `agent = "{host}:7470"`, `fabric_ip = "{host}-fab"`.
# One munged (its own socket and key, in the lab's folder) serves every
# host: network namespaces share the file system. ProctrackType is
# proctrack/linuxproc and TaskPlugin task/none (no cgroups), accounting
# is off; jobs run as root. `down` stops only the lab's own daemons.
# Needs root, iproute2, slurmctld, slurmd, slurm-client and munge.
# Env: PREFIX (default xsl, at most 8 of a-z0-9), MGMT_NET (10.71.0),
# FABRIC_NET (10.72.0).
set -euo pipefail

PREFIX=${PREFIX:-xsl}
export MGMT_NET=${MGMT_NET:-10.71.0}
export FABRIC_NET=${FABRIC_NET:-10.72.0}
HERE=$(cd "$(dirname "$0")" && pwd)
NET="$HERE/netcluster.sh"
DIR=/var/tmp/xfer-slurmlab-$PREFIX
ME=$(basename "$0")

[[ $PREFIX =~ ^[a-z0-9]{1,8}$ ]] || { echo "$ME: PREFIX must be 1-8 of a-z0-9 (got '$PREFIX')" >&2; exit 2; }

name() { echo "$PREFIX-n$1"; }
ns() { echo "$PREFIX-h$1"; }
net() { PREFIX=$PREFIX "$NET" "$@"; }

stop_daemons() {
    local f pid
    for f in "$DIR"/run/*.pid; do
        [[ -e $f ]] || continue
        pid=$(cat "$f" 2>/dev/null || true)
        [[ -n $pid ]] && kill -TERM "$pid" 2>/dev/null || true
    done
    # Bounded: each daemon is checked until it is gone, then killed.
    for f in "$DIR"/run/*.pid; do
        [[ -e $f ]] || continue
        pid=$(cat "$f" 2>/dev/null || true)
        [[ -n $pid ]] || continue
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
        rm -f "$f"
    done
}

down() {
    stop_daemons
    local h
    for h in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$PREFIX-h[0-9]+$" || true); do
        # Job processes a cancelled lab left behind run in its namespaces.
        ip netns pids "$h" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
        rm -rf "/etc/netns/$h"
    done
    net down
}

write_conf() {
    local n=$1 i
    {
        echo "ClusterName=$PREFIX"
        echo "SlurmctldHost=$(name 0)($FABRIC_NET.1)"
        echo "SlurmUser=root"
        echo "SlurmdUser=root"
        echo "AuthType=auth/munge"
        echo "CredType=cred/munge"
        echo "AuthInfo=socket=$DIR/run/munge.sock"
        echo "StateSaveLocation=$DIR/state"
        echo "SlurmdSpoolDir=$DIR/spool/%n"
        echo "SlurmctldPidFile=$DIR/run/slurmctld.pid"
        echo "SlurmdPidFile=$DIR/run/slurmd-%n.pid"
        echo "SlurmctldLogFile=$DIR/log/slurmctld.log"
        echo "SlurmdLogFile=$DIR/log/slurmd-%n.log"
        echo "ProctrackType=proctrack/linuxproc"
        echo "TaskPlugin=task/none"
        echo "JobAcctGatherType=jobacct_gather/none"
        echo "AccountingStorageType=accounting_storage/none"
        echo "JobCompType=jobcomp/none"
        echo "SchedulerType=sched/builtin"
        echo "SelectType=select/linear"
        echo "MpiDefault=none"
        echo "ReturnToService=2"
        echo "SlurmdParameters=config_overrides"
        echo "MailProg=/bin/true"
        echo "SlurmctldTimeout=30"
        echo "SlurmdTimeout=60"
        echo "InactiveLimit=0"
        echo "KillWait=5"
        echo "MinJobAge=3600"
        echo "JobRequeue=1"
        for i in $(seq 1 "$n"); do
            echo "NodeName=$(name "$i") NodeAddr=$FABRIC_NET.$((i + 1)) CPUs=1 RealMemory=256 State=UNKNOWN"
        done
        echo "PartitionName=lab Nodes=$(name 1)$( ((n > 1)) && for i in $(seq 2 "$n"); do printf ',%s' "$(name "$i")"; done) Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
    } >"$DIR/slurm.conf"
}

write_hosts() {
    local n=$1 i j
    for i in $(seq 0 "$n"); do
        mkdir -p "/etc/netns/$(ns "$i")"
        {
            echo "127.0.0.1 localhost"
            for j in $(seq 0 "$n"); do
                echo "$MGMT_NET.$((j + 1)) $(name "$j")"
                echo "$FABRIC_NET.$((j + 1)) $(name "$j")-fab"
            done
        } >"/etc/netns/$(ns "$i")/hosts"
    done
}

MOUNT_CGROUPS='
if ! mountpoint -q /sys/fs/cgroup; then
  if grep -q " - cgroup2 " /proc/1/mountinfo && ! grep -q " - cgroup " /proc/1/mountinfo; then
    mount -t cgroup2 cgroup2 /sys/fs/cgroup
  else
    mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup
    for c in cpu cpuacct cpuset memory devices freezer blkio pids; do
      mkdir -p /sys/fs/cgroup/$c && mount -t cgroup -o $c cgroup /sys/fs/cgroup/$c 2>/dev/null || rmdir /sys/fs/cgroup/$c
    done
    mkdir -p /sys/fs/cgroup/systemd
    mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd
  fi
fi
'

# on I CMD...: CMD on host I with its own host name and the lab's config
# (with EXEC=exec, in place of this shell, so CMD's pid is the caller's).
on() {
    local i=$1
    shift
    # `ip netns exec` mounts a fresh /sys for the namespace (so the host's
    # interfaces are its own), without /sys/fs/cgroup, which slurmd needs
    # to start: the machine's cgroup hierarchies are mounted again there
    # (the same hierarchies, in this command's own mount namespace).
    # $DIR/local is the host's own local disk: $DIR/disks/NAME bound there
    # in the host's mount namespace (where its slurmd, jobs and agent run).
    mkdir -p "$DIR/disks/$(name "$i")" "$DIR/local"
    ${EXEC:-} ip netns exec "$(ns "$i")" unshare --uts env SLURM_CONF="$DIR/slurm.conf" \
        sh -c "$MOUNT_CGROUPS"' mount --bind "$1" "$2" && shift 2 && hostname "$0" && exec "$@"' \
        "$(name "$i")" "$DIR/disks/$(name "$i")" "$DIR/local" "$@"
}

up() {
    local n=$1 mgmt=$2 fabric=$3 i
    for t in slurmctld slurmd munged sinfo; do
        command -v "$t" >/dev/null || { echo "$ME: $t not found; apt-get install slurmctld slurmd slurm-client munge" >&2; exit 1; }
    done
    down
    rm -rf "$DIR"
    mkdir -p "$DIR"/{run,key,state,log}
    for i in $(seq 1 "$n"); do mkdir -p "$DIR/spool/$(name "$i")"; done
    FABRIC_MBIT=$fabric net up "$n" "$mgmt" >/dev/null
    write_hosts "$n"
    write_conf "$n"
    # munged refuses a key others can read, and a folder others can write.
    dd if=/dev/urandom of="$DIR/key/munge.key" bs=1024 count=1 status=none
    chmod 700 "$DIR/key"
    chmod 400 "$DIR/key/munge.key"
    munged --force --socket="$DIR/run/munge.sock" --key-file="$DIR/key/munge.key" \
        --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" \
        --seed-file="$DIR/key/munge.seed"
    for _ in $(seq 50); do [[ -S $DIR/run/munge.sock ]] && break; sleep 0.1; done
    on 0 slurmctld -i -f "$DIR/slurm.conf"
    for i in $(seq 1 "$n"); do
        on "$i" slurmd -N "$(name "$i")" -f "$DIR/slurm.conf"
    done
    # Ready when every node is idle (checked, with a bound).
    local idle=0
    for _ in $(seq 300); do
        idle=$(on 0 sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | grep -c . || true)
        ((idle == n)) && break
        sleep 0.1
    done
    if ((idle != n)); then
        echo "$ME: only $idle of $n nodes came up idle; logs in $DIR/log" >&2
        on 0 sinfo -N -l >&2 || true
        exit 1
    fi
    echo "slurm lab $PREFIX: controller $(name 0), nodes $(name 1)..$(name "$n"), conf $DIR/slurm.conf"
}

cmd=${1:-}
shift || true
case "$cmd" in
    up) [[ $# -eq 3 ]] || { echo "usage: $ME up N MGMT_MBIT FABRIC_MBIT" >&2; exit 2; }; up "$@" ;;
    down) down ;;
    exec) [[ $# -ge 2 ]] || { echo "usage: $ME exec I CMD..." >&2; exit 2; }; EXEC=exec on "$@" ;;
    name) [[ $# -eq 1 ]] || { echo "usage: $ME name I" >&2; exit 2; }; name "$1" ;;
    dir) echo "$DIR" ;;
    disk) [[ $# -eq 1 ]] || { echo "usage: $ME disk I" >&2; exit 2; }; echo "$DIR/disks/$(name "$1")" ;;
    *) echo "usage: $ME up N MGMT_MBIT FABRIC_MBIT | down | exec I CMD... | name I | dir | disk I   (env PREFIX, default xsl)" >&2; exit 2 ;;
esac
