#!/usr/bin/env bash
# The edge topology on one machine, and edgelink attaching pods to it.
#
#   node    stands in for the edge node; uplink0 is its second NIC
#   device  device01-01 at 172.17.16.120 on the private segment, cabled to
#           uplink0, serving a TCP echo on :8080
#   pod-a   gets net1 from edgelink in bridge mode  (bridge edge0 + uplink0)
#   pod-b   gets net1 from edgelink in macvlan mode (on a second NIC uplink1)
#
# Each pod then talks to the device over its net1; the plugin's Result, the
# store and the attachment records are shown, and everything is torn down
# (also on Ctrl-C or failure). KEEP=1 leaves the lab up for poking at it.
# Needs root, iproute2 and python3; run via `make demo`.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${EDGELINK_BIN:-target/release/edgelink}
[[ -x $BIN ]] || BIN=target/debug/edgelink
[[ -x $BIN ]] || { echo "demo: build first (make demo does)" >&2; exit 1; }
KEEP=${KEEP:-}
TAG=elkdemo
NODE=$TAG-node DEV=$TAG-device PODA=$TAG-pod-a PODB=$TAG-pod-b
STATE=$(mktemp -d /tmp/edgelink-demo.XXXXXX)
PIDS=()

cleanup() {
    local rc=$?
    if [[ -n $KEEP && $rc == 0 ]]; then
        echo
        echo "KEEP=1: lab left up. Try:  ip netns exec $PODA ip addr show net1"
        echo "        state in $STATE; remove with:  KEEP= scripts/demo.sh --down"
        return
    fi
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for ns in $PODA $PODB $DEV $NODE; do ip netns del "$ns" 2>/dev/null || true; done
    rm -rf "$STATE"
    [[ $rc == 0 ]] || echo "demo: FAILED (exit $rc); lab torn down" >&2
}

if [[ ${1:-} == --down ]]; then
    for ns in $PODA $PODB $DEV $NODE; do ip netns del "$ns" 2>/dev/null || true; done
    pkill -f "scripts/lab/echo.py serve 172.17.16.120" 2>/dev/null || true
    rm -rf /tmp/edgelink-demo.*
    exit 0
fi
trap cleanup EXIT
trap 'exit 130' INT TERM

say() { printf '\n== %s\n' "$*"; }

cni() { # cni COMMAND CONTAINER NETNS CONFIG-FILE
    ip netns exec $NODE env -i PATH="$PATH" CNI_COMMAND="$1" CNI_CONTAINERID="$2" \
        CNI_NETNS="${3:+/var/run/netns/$3}" CNI_IFNAME=net1 CNI_PATH=/usr/lib/cni \
        CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAMESPACE=hil;K8S_POD_NAME=$2" \
        "$BIN" < "$4"
}

ms() { date +%s%N; }

say "lab: node, device01-01 (172.17.16.120) on the private segment, two pods"
for ns in $NODE $DEV $PODA $PODB; do
    ip netns del "$ns" 2>/dev/null || true
    ip netns add "$ns"
    ip -n "$ns" link set lo up
done
# Two NICs of the node on the same segment: a veth pair each, device side
# joined by a bridge in the device namespace (a switch).
ip -n $DEV link add sw0 type bridge
ip -n $DEV link set sw0 up
for i in 0 1; do
    ip -n $NODE link add uplink$i type veth peer name port$i netns $DEV
    ip -n $DEV link set port$i master sw0 up
    ip -n $NODE link set uplink$i up
done
ip -n $DEV addr add 172.17.16.120/24 dev sw0
ip netns exec $DEV python3 scripts/lab/echo.py serve 172.17.16.120 8080 &
PIDS+=($!)

cat > "$STATE/bridge.json" <<JSON
{"cniVersion": "1.0.0", "name": "plant-floor", "type": "edgelink",
 "mode": "bridge", "bridge": "edge0", "uplink": "uplink0", "stateDir": "$STATE",
 "ipam": {"ranges": [[{"subnet": "172.17.16.0/24", "rangeStart": "172.17.16.200",
          "rangeEnd": "172.17.16.250", "gateway": "172.17.16.1"}]],
          "exclude": ["172.17.16.210/32"], "nodeName": "kedge1"},
 "forwards": [{"name": "api", "protocol": "tcp", "port": 8080, "target": "172.17.16.120:8080"}]}
JSON
sed -e 's/"mode": "bridge", "bridge": "edge0", "uplink": "uplink0"/"mode": "macvlan", "uplink": "uplink1"/' \
    -e 's/"plant-floor"/"plant-floor-mv"/' -e 's/172.17.16.200/172.17.16.230/' \
    "$STATE/bridge.json" > "$STATE/macvlan.json"

for _ in $(seq 50); do
    ip netns exec $DEV python3 -c 'import socket; socket.create_connection(("172.17.16.120", 8080), 1)' 2>/dev/null && break
    sleep 0.1
done

say "ADD pod-a, mode bridge (edge0 enslaves uplink0)"
t0=$(ms); cni ADD pod-a $PODA "$STATE/bridge.json" > "$STATE/a.json"; t1=$(ms)
python3 -m json.tool "$STATE/a.json"
echo "ADD took $(( (t1 - t0) / 1000 )) µs (including ip netns exec)"

say "ADD pod-b, mode macvlan (child of uplink1)"
t0=$(ms); cni ADD pod-b $PODB "$STATE/macvlan.json" > "$STATE/b.json"; t1=$(ms)
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print("pod-b net1:", r["ips"][0]["address"], r["interfaces"][0]["mac"])' "$STATE/b.json"
echo "ADD took $(( (t1 - t0) / 1000 )) µs (including ip netns exec)"

say "pods talk to device01-01 over net1"
summary=()
for p in $PODA $PODB; do
    out=$(ip netns exec "$p" python3 scripts/lab/echo.py ping 172.17.16.120 8080 200)
    read -r _ bytes rtt <<<"$out"
    summary+=("$(printf '%-16s net1 %-18s tcp 172.17.16.120:8080  %6d bytes  rtt %4d µs  OK' \
        "$p" "$(ip -n "$p" -o -4 addr show net1 | awk '{print $4}')" "$bytes" "$rtt")")
done
printf '%s\n' "${summary[@]}"

say "CHECK pod-a (prevResult from ADD)"
python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); c["prevResult"]=json.load(open(sys.argv[2])); print(json.dumps(c))' \
    "$STATE/bridge.json" "$STATE/a.json" > "$STATE/a-check.json"
cni CHECK pod-a $PODA "$STATE/a-check.json" && echo "CHECK ok"

say "state: reservations and attachment records (the node daemon reads these)"
find "$STATE/ipam" "$STATE/attachments" -type f ! -name lock | sed "s|$STATE/||" | sort
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print("record:", {k: r[k] for k in ("podNamespace","podName","netns","forwards")})' \
    "$STATE/attachments/pod-a_net1.json"

if [[ -n $KEEP ]]; then exit 0; fi

say "DEL both (twice, the second time without netns, as containerd does)"
cni DEL pod-a $PODA "$STATE/a-check.json"
cni DEL pod-b $PODB "$STATE/macvlan.json"
cni DEL pod-a "" "$STATE/bridge.json"
cni DEL pod-b "" "$STATE/macvlan.json"
left=$(find "$STATE/ipam" "$STATE/attachments" -type f ! -name lock ! -name 'last_reserved_ip.*' ! -path '*/sticky/*' | wc -l)
echo "leftover reservations/records: $left"
[[ $left == 0 ]]

say "summary"
printf '%s\n' "${summary[@]}"
echo "The node daemon (edgelinkd) that serves the forwards is not part of this build yet."
