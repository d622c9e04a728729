#!/usr/bin/env bash
# A cluster of shaped hosts on one machine, for integration tests and
# benchmarks: N+1 network namespaces (hosts 0..N) plugged into one bridge
# that lives in its own namespace, so the machine's own network is never
# touched. Every host link is shaped with `tc tbf` in both directions
# (host egress = its upload, bridge egress towards it = its download).
#
#   scripts/netcluster.sh up N RATE_MBIT   create hosts 0..N (replaces an old cluster)
#   scripts/netcluster.sh down             remove everything
#   scripts/netcluster.sh exec I CMD...    run CMD inside host I
#   scripts/netcluster.sh ip I             print host I's address
#   scripts/netcluster.sh status           list hosts, addresses and qdiscs
#
# Addresses are 10.78.0.(I+1)/24 and exist only inside these namespaces.
# Needs root and iproute2. Env: PREFIX (default xfc), TBF_BURST (256kb),
# TBF_LATENCY (50ms), MTU (1500).
set -euo pipefail

PREFIX=${PREFIX:-xfc}
SW="$PREFIX-sw"
BURST=${TBF_BURST:-256kb}
LATENCY=${TBF_LATENCY:-50ms}
MTU=${MTU:-1500}

host() { echo "$PREFIX-h$1"; }
addr() { echo "10.78.0.$(($1 + 1))"; }

hosts() {
    ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$PREFIX-h[0-9]+$" | sort -V || true
}

down() {
    for h in $(hosts); do ip netns del "$h" 2>/dev/null || true; done
    ip netns del "$SW" 2>/dev/null || true
}

up() {
    local n=$1 rate=$2
    [[ $n =~ ^[0-9]+$ && $n -ge 1 && $n -le 60 ]] || { echo "N must be 1..60" >&2; exit 2; }
    [[ $rate =~ ^[0-9]+$ && $rate -ge 1 ]] || { echo "RATE_MBIT must be a positive integer" >&2; exit 2; }
    down
    ip netns add "$SW"
    ip -n "$SW" link set lo up
    ip -n "$SW" link add br0 type bridge
    ip -n "$SW" link set br0 up
    for i in $(seq 0 "$n"); do
        local h
        h=$(host "$i")
        ip netns add "$h"
        ip -n "$h" link set lo up
        ip link add eth0 netns "$h" mtu "$MTU" type veth peer name "p$i" netns "$SW" mtu "$MTU"
        ip -n "$SW" link set "p$i" master br0 up
        ip -n "$h" addr add "$(addr "$i")/24" dev eth0
        ip -n "$h" link set eth0 up
        tc -n "$h" qdisc replace dev eth0 root tbf rate "${rate}mbit" burst "$BURST" latency "$LATENCY"
        tc -n "$SW" qdisc replace dev "p$i" root tbf rate "${rate}mbit" burst "$BURST" latency "$LATENCY"
    done
    # Wait until host 0 reaches the last host.
    command -v ping >/dev/null || { echo "ping not found (apt-get install iputils-ping); not waiting" >&2; return 0; }
    for _ in $(seq 50); do
        ip netns exec "$(host 0)" ping -c1 -W1 "$(addr "$n")" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "cluster is up but host 0 cannot reach host $n" >&2
    exit 1
}

status() {
    for h in $(hosts); do
        printf '%s %s %s\n' "$h" \
            "$(ip -n "$h" -4 -o addr show dev eth0 | awk '{print $4}')" \
            "$(tc -n "$h" qdisc show dev eth0 | head -1)"
    done
}

cmd=${1:-}
shift || true
case "$cmd" in
    up) [[ $# -eq 2 ]] || { echo "usage: $0 up N RATE_MBIT" >&2; exit 2; }; up "$1" "$2" ;;
    down) down ;;
    exec)
        [[ $# -ge 2 ]] || { echo "usage: $0 exec I CMD..." >&2; exit 2; }
        i=$1; shift
        exec ip netns exec "$(host "$i")" "$@"
        ;;
    ip) [[ $# -eq 1 ]] || { echo "usage: $0 ip I" >&2; exit 2; }; addr "$1" ;;
    status) status ;;
    *) echo "usage: $0 up N RATE_MBIT | down | exec I CMD... | ip I | status" >&2; exit 2 ;;
esac
