# The NAT topology the relay's and the market's NAT tests share (test-relay-nat.sh,
# test-market-nat.sh): network namespaces on TEST-NET addresses, reachable only inside them.
#
#   pub   203.0.113.1
#   nat   203.0.113.2 / 198.51.100.1: a router that masquerades the phone's traffic and drops
#         every connection that starts on its public side (nftables)
#   phone 198.51.100.2, default route through the nat
#
# nat_setup PUB NAT PHONE: makes the three namespaces (names of this test's own) and removes
# them at exit (after the processes in PIDS are killed). Needs root, ip and nft; a failure
# stops the script.
nat_setup() {
    local pub=$1 nat=$2 phone=$3 n l
    [ "$(id -u)" = 0 ] || die "needs root for network namespaces"
    command -v ip >/dev/null || die "ip (iproute2) missing"
    command -v nft >/dev/null || die "nft (nftables) missing"
    NAT_NS="$pub $nat $phone"
    at_exit nat_cleanup
    for n in $pub $nat $phone; do ip netns add "$n" || die "ip netns add $n"; ip -n "$n" link set lo up; done
    ip link add pub0 netns $pub type veth peer name wan0 netns $nat || die "veth pub-nat"
    ip link add lan0 netns $nat type veth peer name ph0 netns $phone || die "veth nat-phone"
    ip -n $pub addr add 203.0.113.1/24 dev pub0
    ip -n $nat addr add 203.0.113.2/24 dev wan0
    ip -n $nat addr add 198.51.100.1/24 dev lan0
    ip -n $phone addr add 198.51.100.2/24 dev ph0
    for l in "$pub pub0" "$nat wan0" "$nat lan0" "$phone ph0"; do set -- $l; ip -n "$1" link set "$2" up; done
    ip -n $phone route add default via 198.51.100.1
    # pub knows where the phone's network is (as an ISP would): only the NAT can stop the dial
    ip -n $pub route add 198.51.100.0/24 via 203.0.113.2
    ip netns exec $nat sysctl -qw net.ipv4.ip_forward=1
    ip netns exec $nat nft -f - <<'NFT' || die "nftables rules"
table ip nat {
    chain postrouting { type nat hook postrouting priority 100; oifname "wan0" ip saddr 198.51.100.0/24 masquerade; }
}
table inet filter {
    chain forward {
        type filter hook forward priority 0; policy drop;
        ct state established,related accept
        iifname "lan0" oifname "wan0" accept
    }
    chain input {
        type filter hook input priority 0; policy drop;
        ct state established,related accept
        iifname { "lo", "lan0" } accept
    }
}
NFT
}
nat_cleanup() {
    local p n
    for p in $PIDS; do kill "$p" 2>/dev/null; done
    for p in $PIDS; do wait "$p" 2>/dev/null; done
    PIDS=""
    for n in $NAT_NS; do ip netns del "$n" 2>/dev/null; done
}

# nat_dial_blocked PUB PHONE PORT: checks that a listener in the phone answers inside the
# phone, but a dial from pub does not get through (else a failure)
nat_dial_blocked() {
    local pub=$1 phone=$2 port=$3
    ip netns exec $phone /usr/bin/python3 -c '
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(4); time.sleep(60)' "$port" &
    PIDS="$PIDS $!"
    # (python starts slowly on a loaded machine: give it time)
    wait_for 10 ip netns exec $phone timeout 1 bash -c "echo > /dev/tcp/198.51.100.2/$port" 2>/dev/null ||
        fail "the phone's own listener is not up"
    if ip netns exec $pub timeout 3 bash -c "echo > /dev/tcp/198.51.100.2/$port" 2>/dev/null; then
        fail "a direct dial from pub into the phone got through the NAT"
    fi
}
