# shellcheck shell=bash
# Two network namespaces joined by one veth pair, each end shaped by a token
# bucket: a private, repeatable "1 Gbit/s link" on one machine.
#
#   [ns $NS_A] $VETH_A 10.77.0.1/24  <==== veth ====>  $VETH_B 10.77.0.2/24 [ns $NS_B]
#              tbf rate 1gbit                          tbf rate 1gbit
#
# The veth pair is created directly inside $NS_A (its peer directly inside
# $NS_B), so nothing is ever added to, or routed through, the host's own
# network namespace. Deleting the namespaces deletes the pair.
#
# tbf parameters (override through the environment):
#   TBF_RATE=1gbit     the shaped line rate (125e6 bytes/s)
#   TBF_BURST=256kb    bucket size, 256 KiB: ~2 ms of line rate. It must hold
#                      several MTU-sized packets and tolerate timer slack;
#                      64kb measured ~850 Mbit/s with TCP retransmits, 256kb
#                      lets iperf3 reach 956 Mbit/s at MTU 1500 (the TCP
#                      payload ceiling, 1448/1514 of the rate) and ~990 at 9000.
#   TBF_LATENCY=50ms   queue limit expressed as time: limit = rate * latency
#                      + burst, ~6.5 MB. Deep enough that a single TCP flow
#                      never sees a tail drop.
# Source this file; it only defines functions and defaults.

NS_A=${NS_A:-xfb-a}
NS_B=${NS_B:-xfb-b}
VETH_A=${VETH_A:-xfb-va}
VETH_B=${VETH_B:-xfb-vb}
IP_A=${IP_A:-10.77.0.1}
IP_B=${IP_B:-10.77.0.2}
NET_PREFIX=${NET_PREFIX:-24}
TBF_RATE=${TBF_RATE:-1gbit}
TBF_BURST=${TBF_BURST:-256kb}
TBF_LATENCY=${TBF_LATENCY:-50ms}

# netns_down: remove both namespaces (and with them the veth pair). Safe to
# call when they do not exist.
netns_down() {
    local ns
    for ns in "$NS_A" "$NS_B"; do
        if ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$ns"; then
            ip netns del "$ns" 2>/dev/null || true
        fi
    done
}

# netns_up MTU: (re)create the two namespaces, the shaped veth pair with the
# given MTU, and bring everything up.
netns_up() {
    local mtu=${1:-1500}
    netns_down
    ip netns add "$NS_A"
    ip netns add "$NS_B"
    ip -n "$NS_A" link add "$VETH_A" mtu "$mtu" type veth \
        peer name "$VETH_B" mtu "$mtu" netns "$NS_B"
    ip -n "$NS_A" addr add "$IP_A/$NET_PREFIX" dev "$VETH_A"
    ip -n "$NS_B" addr add "$IP_B/$NET_PREFIX" dev "$VETH_B"
    ip -n "$NS_A" link set lo up
    ip -n "$NS_B" link set lo up
    ip -n "$NS_A" link set "$VETH_A" up
    ip -n "$NS_B" link set "$VETH_B" up
    ip netns exec "$NS_A" tc qdisc replace dev "$VETH_A" root tbf \
        rate "$TBF_RATE" burst "$TBF_BURST" latency "$TBF_LATENCY"
    ip netns exec "$NS_B" tc qdisc replace dev "$VETH_B" root tbf \
        rate "$TBF_RATE" burst "$TBF_BURST" latency "$TBF_LATENCY"
}

# netns_qdisc_stats: one line per side, "sent N pkt P dropped D".
netns_qdisc_stats() {
    local ns dev
    for ns in "$NS_A:$VETH_A" "$NS_B:$VETH_B"; do
        dev=${ns#*:}
        ns=${ns%%:*}
        ip netns exec "$ns" tc -s qdisc show dev "$dev" |
            awk -v side="$ns/$dev" '/Sent/ {gsub(/[(,]/, " "); print side": sent "$2" B "$4" pkt dropped "$7" overlimits "$9}'
    done
}
