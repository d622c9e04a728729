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
#   scripts/netcluster.sh ip I             print host I's (management) address
#   scripts/netcluster.sh fip I            print host I's fabric address (two networks)
#   scripts/netcluster.sh bytes I IF [up|down]
#                                          bytes tc has sent on host I's link IF
#                                          (eth0, eth1): up = the host's egress
#                                          (default), down = the bridge's towards it
#   scripts/netcluster.sh cut I [link|drop]   cut host I's fabric: eth1 down (link,
#                                          default: like a pulled cable) or an nft
#                                          table dropping all eth1 traffic (drop)
#   scripts/netcluster.sh uncut I          undo `cut`
#   scripts/netcluster.sh status           list hosts, addresses and qdiscs
#
# Addresses are $MGMT_NET.(I+1)/24 (default 10.78.0.x) on eth0 and exist only
# inside these namespaces. Needs root and iproute2 (nft for `cut I drop`).
# Env: PREFIX (default xfc), TBF_BURST (256kb), TBF_LATENCY (50ms), MTU (1500),
# and for two networks:
#   MGMT_NET=A.B.C     the management (eth0) subnet, default 10.78.0
#   FABRIC_MBIT=R      adds a fabric: a second bridge and an eth1 per host at
#                      $FABRIC_NET.(I+1)/24, tbf-shaped at R Mbit/s both ways
#                      (eth0 stays at RATE_MBIT); unset: one network, as before
#   FABRIC_NET=A.B.C   the fabric subnet, default 10.79.0
#   ROOT_ATTACH=1      also plugs the root namespace into the management bridge
#                      (veth $PREFIX-r, $MGMT_NET.254/24, unshaped, no default
#                      route), so operator commands run from the root namespace.
#                      Refused (exit 3) when the root namespace already routes
#                      any part of $MGMT_NET.0/24 (the half-made cluster is
#                      removed); pick another MGMT_NET then.
#                      PREFIX must be at most 13 characters for it.
# `down` removes the namespaces, the root veth and nothing else.
set -euo pipefail

PREFIX=${PREFIX:-xfc}
SW="$PREFIX-sw"
BURST=${TBF_BURST:-256kb}
LATENCY=${TBF_LATENCY:-50ms}
MTU=${MTU:-1500}
MGMT_NET=${MGMT_NET:-10.78.0}
FABRIC_NET=${FABRIC_NET:-10.79.0}
FABRIC_MBIT=${FABRIC_MBIT:-}
ROOT_ATTACH=${ROOT_ATTACH:-0}
RLINK="$PREFIX-r"
LOCK=/run/xfer-netcluster.lock

host() { echo "$PREFIX-h$1"; }
addr() { echo "$MGMT_NET.$(($1 + 1))"; }
faddr() { echo "$FABRIC_NET.$(($1 + 1))"; }

net3() { # net3 NAME VALUE: VALUE must be A.B.C
    [[ $2 =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] || { echo "$1 must look like 10.78.0 (got '$2')" >&2; exit 2; }
}

hosts() {
    ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$PREFIX-h[0-9]+$" | sort -V || true
}

down() {
    for h in $(hosts); do ip netns del "$h" 2>/dev/null || true; done
    ip netns del "$SW" 2>/dev/null || true
    # Deleting the switch namespace deletes the root veth's peer and so the
    # veth itself; this is for a half-made cluster.
    if ip link show "$RLINK" >/dev/null 2>&1; then ip link del "$RLINK" 2>/dev/null || true; fi
}

shape() { # shape NS DEV MBIT
    tc -n "$1" qdisc replace dev "$2" root tbf rate "${3}mbit" burst "$BURST" latency "$LATENCY"
}

# attach_root: the root namespace joins br0 at $MGMT_NET.254, unless it
# already routes some of that subnet.
attach_root() {
    [[ ${#RLINK} -le 15 ]] || { echo "PREFIX too long for ROOT_ATTACH (at most 13 characters)" >&2; exit 2; }
    exec 8>"$LOCK"
    flock 8
    local clash
    clash=$({
        ip -4 route show match "$MGMT_NET.1" | grep -v '^default' || true
        ip -4 route show root "$MGMT_NET.0/24" || true
    } | sort -u)
    if [[ -n $clash ]]; then
        echo "the root namespace already routes $MGMT_NET.x; not attaching: $clash" >&2
        exec 8>&-
        down
        exit 3
    fi
    ip link add "$RLINK" mtu "$MTU" type veth peer name proot netns "$SW" mtu "$MTU"
    ip -n "$SW" link set proot master br0 up
    ip addr add "$MGMT_NET.254/24" dev "$RLINK"
    ip link set "$RLINK" up
    exec 8>&-
}

up() {
    local n=$1 rate=$2
    [[ $n =~ ^[0-9]+$ && $n -ge 1 && $n -le 60 ]] || { echo "N must be 1..60" >&2; exit 2; }
    [[ $rate =~ ^[0-9]+$ && $rate -ge 1 ]] || { echo "RATE_MBIT must be a positive integer" >&2; exit 2; }
    net3 MGMT_NET "$MGMT_NET"
    if [[ -n $FABRIC_MBIT ]]; then
        [[ $FABRIC_MBIT =~ ^[0-9]+$ && $FABRIC_MBIT -ge 1 ]] || { echo "FABRIC_MBIT must be a positive integer" >&2; exit 2; }
        net3 FABRIC_NET "$FABRIC_NET"
        [[ $FABRIC_NET != "$MGMT_NET" ]] || { echo "FABRIC_NET must differ from MGMT_NET" >&2; exit 2; }
    fi
    down
    ip netns add "$SW"
    ip -n "$SW" link set lo up
    ip -n "$SW" link add br0 type bridge
    ip -n "$SW" link set br0 up
    if [[ -n $FABRIC_MBIT ]]; then
        ip -n "$SW" link add br1 type bridge
        ip -n "$SW" link set br1 up
    fi
    for i in $(seq 0 "$n"); do
        local h
        h=$(host "$i")
        ip netns add "$h"
        ip -n "$h" link set lo up
        ip link add eth0 netns "$h" mtu "$MTU" type veth peer name "p$i" netns "$SW" mtu "$MTU"
        ip -n "$SW" link set "p$i" master br0 up
        ip -n "$h" addr add "$(addr "$i")/24" dev eth0
        ip -n "$h" link set eth0 up
        shape "$h" eth0 "$rate"
        shape "$SW" "p$i" "$rate"
        if [[ -n $FABRIC_MBIT ]]; then
            ip link add eth1 netns "$h" mtu "$MTU" type veth peer name "f$i" netns "$SW" mtu "$MTU"
            ip -n "$SW" link set "f$i" master br1 up
            ip -n "$h" addr add "$(faddr "$i")/24" dev eth1
            ip -n "$h" link set eth1 up
            shape "$h" eth1 "$FABRIC_MBIT"
            shape "$SW" "f$i" "$FABRIC_MBIT"
        fi
    done
    if [[ $ROOT_ATTACH == 1 ]]; then attach_root; fi
    # Wait until host 0 reaches the last host (and the root namespace host 0).
    command -v ping >/dev/null || { echo "ping not found (apt-get install iputils-ping); not waiting" >&2; return 0; }
    for _ in $(seq 50); do
        if ip netns exec "$(host 0)" ping -c1 -W1 "$(addr "$n")" >/dev/null 2>&1 &&
            { [[ -z $FABRIC_MBIT ]] || ip netns exec "$(host 0)" ping -c1 -W1 "$(faddr "$n")" >/dev/null 2>&1; } &&
            { [[ $ROOT_ATTACH != 1 ]] || ping -c1 -W1 "$(addr 0)" >/dev/null 2>&1; }; then
            return 0
        fi
        sleep 0.1
    done
    echo "cluster is up but host 0 cannot reach host $n (or the root namespace host 0)" >&2
    exit 1
}

# bytes I IF [up|down]: the "Sent N bytes" of the tbf qdisc on that link.
bytes() {
    local i=$1 dev=$2 dir=${3:-up} ns port
    case $dir in
        up) ns=$(host "$i") port=$dev ;;
        down)
            ns=$SW
            case $dev in
                eth0) port=p$i ;;
                eth1) port=f$i ;;
                *) echo "IF must be eth0 or eth1" >&2; exit 2 ;;
            esac
            ;;
        *) echo "direction must be up or down" >&2; exit 2 ;;
    esac
    tc -n "$ns" -s qdisc show dev "$port" | awk '/Sent/ { print $2; found = 1; exit } END { if (!found) exit 1 }'
}

cut() {
    local i=$1 how=${2:-link} h
    h=$(host "$i")
    case $how in
        link) ip -n "$h" link set eth1 down ;;
        drop)
            ip netns exec "$h" nft -f - <<NFT
table inet fabcut {
    chain in { type filter hook input priority -10; iifname "eth1" drop; }
    chain out { type filter hook output priority -10; oifname "eth1" drop; }
}
NFT
            ;;
        *) echo "cut I [link|drop]" >&2; exit 2 ;;
    esac
}

uncut() {
    local h
    h=$(host "$1")
    ip -n "$h" link set eth1 up
    ip netns exec "$h" nft delete table inet fabcut 2>/dev/null || true
}

status() {
    for h in $(hosts); do
        printf '%s %s %s\n' "$h" \
            "$(ip -n "$h" -4 -o addr show dev eth0 | awk '{print $4}')" \
            "$(tc -n "$h" qdisc show dev eth0 | head -1)"
        if ip -n "$h" link show eth1 >/dev/null 2>&1; then
            printf '%s %s %s\n' "$h" \
                "$(ip -n "$h" -4 -o addr show dev eth1 | awk '{print $4}') eth1 $(ip -n "$h" -br link show eth1 | awk '{print $2}')" \
                "$(tc -n "$h" qdisc show dev eth1 | head -1)"
        fi
    done
    if ip link show "$RLINK" >/dev/null 2>&1; then
        printf 'root %s\n' "$(ip -4 -o addr show dev "$RLINK" | awk '{print $4}') ($RLINK)"
    fi
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
    fip) [[ $# -eq 1 ]] || { echo "usage: $0 fip I" >&2; exit 2; }; faddr "$1" ;;
    bytes) [[ $# -ge 2 && $# -le 3 ]] || { echo "usage: $0 bytes I IF [up|down]" >&2; exit 2; }; bytes "$@" ;;
    cut) [[ $# -ge 1 && $# -le 2 ]] || { echo "usage: $0 cut I [link|drop]" >&2; exit 2; }; cut "$@" ;;
    uncut) [[ $# -eq 1 ]] || { echo "usage: $0 uncut I" >&2; exit 2; }; uncut "$1" ;;
    status) status ;;
    *) echo "usage: $0 up N RATE_MBIT | down | exec I CMD... | ip I | fip I | bytes I IF [up|down] | cut I [link|drop] | uncut I | status" >&2; exit 2 ;;
esac
