#!/usr/bin/env bash
# A cluster of N nodes with two NICs each, for launcher tests: a management
# network the launcher (in the root namespace) reaches every node through,
# and a separate fabric the engine ranks talk over, with interface names that
# differ per node like cross-wired boxes.
#
#   scripts/launchnet.sh up N [MTU]     create nodes 1..N (replaces an old cluster); MTU of the fabric, default 1500
#   scripts/launchnet.sh down           remove everything it created
#   scripts/launchnet.sh exec I CMD...  run CMD inside node I
#   scripts/launchnet.sh status         per node: interfaces, addresses, default route
#
#   root ns                              node i (ns $PREFIX-n$i)
#   $PREFIX-m$i 10.79.i.1/24 <== veth ==> mgmt0 10.79.i.2/24, default via 10.79.i.1
#                                         fab0 (odd i) | enp1s0f1 (even i) 10.80.0.i/24
#   ns $PREFIX-sw: bridge br0 <== veth ==> each node's fabric interface (peer p$i)
#
# The root namespace reaches every 10.79.i.2, but an nftables table
# `inet $PREFIX` drops whatever it would forward to or from the management
# links, so nodes reach each other only over the fabric (and nothing beyond
# the root namespace). Each node gets /etc/netns/NODE/resolv.conf (no name
# server: lookups fail at once). `down` deletes the namespaces (and with
# them every veth), those files and that table; nothing else on the
# machine is touched.
# Needs root, iproute2 and nft. Env: PREFIX (default xln; a-z0-9, <= 8 chars);
# MGMT_NET (default 10.79: node i's management link is MGMT_NET.i.0/24) and
# FABRIC_NET (default 10.80.0: node i is FABRIC_NET.i), so that two
# clusters with other prefixes and networks can be up at once.
set -euo pipefail

PREFIX=${PREFIX:-xln}
MGMT_NET=${MGMT_NET:-10.79}
FABRIC_NET=${FABRIC_NET:-10.80.0}
SW="$PREFIX-sw"
ME=$(basename "$0")

usage() {
    echo "usage: $ME up N [MTU] | down | exec I CMD... | status   (env PREFIX, default xln)" >&2
    exit 2
}

node() { echo "$PREFIX-n$1"; }
mlink() { echo "$PREFIX-m$1"; }
fabif() { if (($1 % 2)); then echo fab0; else echo enp1s0f1; fi; }

nodes() {
    ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$PREFIX-n[0-9]+$" | sed "s/^$PREFIX-n//" | sort -n || true
}

down() {
    local i l
    for i in $(nodes); do
        ip netns del "$(node "$i")" 2>/dev/null || true
        rm -rf "/etc/netns/$(node "$i")"
    done
    ip netns del "$SW" 2>/dev/null || true
    # Root ends whose node namespace someone else removed are gone with it;
    # any left over (a half-done `up`) go here.
    for l in $(root_ends "$PREFIX"); do
        ip link del "$l" 2>/dev/null || true
    done
    nft delete table inet "$PREFIX" 2>/dev/null || true
    # The kernel dismantles a deleted namespace in the background: wait
    # until none of this cluster's root ends (and their routes) is left, so
    # the next cluster on the same networks does not find them.
    local k
    for k in $(seq 100); do
        [[ -z $(root_ends "$PREFIX") ]] && return 0
        for l in $(root_ends "$PREFIX"); do ip link del "$l" 2>/dev/null || true; done
        sleep 0.1
    done
    echo "$ME: down: still present after 10 s: $(root_ends "$PREFIX" | tr '\n' ' ')" >&2
    return 1
}

# The root ends of cluster $1's management links (all clusters' with $1 = any).
root_ends() {
    local p=$1
    [[ $p == any ]] && p='[a-z0-9]{1,8}'
    ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E "^$p-m[0-9]+$" || true
}

# Root ends on our networks left by a cluster whose node namespace is gone
# (its `down` never ran: a killed test or bench). Nothing else uses them.
clear_orphans() {
    local l ns
    for l in $(root_ends any); do
        ns=${l%-m*}-n${l##*-m}
        ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$ns" && continue
        if ip -4 route show dev "$l" 2>/dev/null | grep -Eq "$1"; then
            echo "$ME: removing $l, left on $MGMT_NET.x by a cluster whose namespace $ns is gone" >&2
            ip link del "$l" 2>/dev/null || true
        fi
    done
}

up() {
    local n=$1 mtu=${2:-1500} i ns
    [[ $n =~ ^[0-9]+$ && $n -ge 1 && $n -le 60 ]] || { echo "$ME: N must be 1..60" >&2; exit 2; }
    [[ $mtu =~ ^[0-9]+$ && $mtu -ge 576 && $mtu -le 65535 ]] || { echo "$ME: MTU must be 576..65535" >&2; exit 2; }
    command -v nft >/dev/null || { echo "$ME: nft not found (apt-get install nftables)" >&2; exit 1; }
    down
    # Refuse to shadow networks the machine already uses.
    local taken="^(${MGMT_NET//./\\.}|${FABRIC_NET//./\\.})\\."
    clear_orphans "$taken"
    if ip -4 route show | grep -Eq "$taken"; then
        echo "$ME: the root namespace already routes $MGMT_NET.x or $FABRIC_NET.x; not touching it:" >&2
        ip -4 route show | grep -E "$taken" >&2
        exit 1
    fi
    trap 'down' EXIT   # a half-built cluster is removed
    nft -f - <<EOF
table inet $PREFIX {
    chain forward {
        type filter hook forward priority filter; policy accept;
        iifname "$PREFIX-m*" drop
        oifname "$PREFIX-m*" drop
    }
}
EOF
    ip netns add "$SW"
    ip -n "$SW" link set lo up
    ip -n "$SW" link add br0 mtu "$mtu" type bridge
    ip -n "$SW" link set br0 up
    for i in $(seq 1 "$n"); do
        ns=$(node "$i")
        ip netns add "$ns"
        ip -n "$ns" link set lo up
        # Management: one end here (the root namespace), the other in the node.
        ip link add "$(mlink "$i")" type veth peer name mgmt0 netns "$ns"
        ip -n "$ns" addr add "$MGMT_NET.$i.2/24" dev mgmt0
        ip -n "$ns" link set mgmt0 up
        ip addr add "$MGMT_NET.$i.1/24" dev "$(mlink "$i")"
        ip link set "$(mlink "$i")" up
        ip -n "$ns" route add default via "$MGMT_NET.$i.1" dev mgmt0
        # Fabric: into the bridge.
        ip -n "$ns" link add "$(fabif "$i")" mtu "$mtu" type veth peer name "p$i" netns "$SW" mtu "$mtu"
        ip -n "$SW" link set "p$i" master br0 up
        ip -n "$ns" addr add "$FABRIC_NET.$i/24" dev "$(fabif "$i")"
        ip -n "$ns" link set "$(fabif "$i")" up
        # No name server is reachable from a node: make lookups fail at
        # once, as on a cluster whose DNS answers, instead of waiting for
        # the host's resolver twice 5 s (torch.distributed looks up every
        # peer's name; `ip netns exec` mounts this over /etc/resolv.conf).
        mkdir -p "/etc/netns/$ns"
        printf 'nameserver 127.0.0.1\noptions timeout:1 attempts:1\n' >"/etc/netns/$ns/resolv.conf"
    done
    trap - EXIT
    command -v ping >/dev/null || { echo "$ME: ping not found (apt-get install iputils-ping); not waiting" >&2; return 0; }
    for _ in $(seq 50); do
        if ping -c1 -W1 "$MGMT_NET.$n.2" >/dev/null 2>&1 &&
            ip netns exec "$(node 1)" ping -c1 -W1 "$FABRIC_NET.$n" >/dev/null 2>&1; then
            return 0
        fi
        sleep 0.1
    done
    echo "$ME: the cluster is up but the root cannot reach $MGMT_NET.$n.2 or node 1 cannot reach $FABRIC_NET.$n" >&2
    exit 1
}

status() {
    local i ns
    for i in $(nodes); do
        ns=$(node "$i")
        printf '%s:' "$ns"
        ip -n "$ns" -4 -o addr show | awk '$2 != "lo" {printf " %s=%s", $2, $4}'
        printf ' mtu(%s)=%s' "$(fabif "$i")" "$(ip -n "$ns" -o link show dev "$(fabif "$i")" 2>/dev/null | sed -n 's/.* mtu \([0-9]*\).*/\1/p')"
        printf ' | %s\n' "$(ip -n "$ns" -4 route show default | head -1)"
    done
    if nft list table inet "$PREFIX" >/dev/null 2>&1; then
        echo "nft table inet $PREFIX: present (no forwarding between $PREFIX-m*)"
    else
        echo "nft table inet $PREFIX: absent"
    fi
}

cmd=${1:-}
shift || true
case "$cmd" in
    up | down | exec | status) ;;
    *) usage ;;
esac
[[ $PREFIX =~ ^[a-z][a-z0-9]{0,7}$ ]] || { echo "$ME: PREFIX must be a-z0-9, 1..8 characters, starting with a letter" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || { echo "$ME: needs root (it creates network namespaces, veth pairs and an nftables table)" >&2; exit 1; }
case "$cmd" in
    up) [[ $# -ge 1 && $# -le 2 ]] || usage; up "$@" ;;
    down) down ;;
    exec)
        [[ $# -ge 2 ]] || usage
        i=$1
        shift
        exec ip netns exec "$(node "$i")" "$@"
        ;;
    status) status ;;
esac
