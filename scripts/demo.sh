#!/usr/bin/env bash
# The edge topology on one machine, edgelink attaching a proxy pod to it,
# and a cluster client reaching the device through the pod's forwards;
# then the other way: the device publishes to a collector in the cluster
# through the pod's reverse forward.
#
#   node     stands in for the edge node; uplink0 is its second NIC;
#            edgelinkd runs here (its status on 127.0.0.1:9310 in this netns)
#   device   device01-01 at 172.17.16.120 on the private segment: TCP echo
#            on :8080, HTTP on :80, UDP echo on :5000
#   pod      the proxy pod: eth0 on the "cluster" (10.244.1.10), net1 from
#            the edgelink plugin (bridge edge0 + uplink0) with four forwards:
#            api (relayed, at most 8 connections to the device, the rest
#            queued), web, telemetry (UDP), and api-kernel (the pod's own
#            kernel forwards it: nftables DNAT that edgelinkd installs);
#            and one reverse forward, mqtt: devices dial net1:1883 and
#            edgelinkd relays them, as the pod, to the collector
#   client   a pod elsewhere in the cluster (10.244.1.20); also runs the
#            collector on :1883 (stands in for an MQTT broker: prints each
#            line it receives and who sent it)
#   pod-mv   a second pod with a macvlan net1, reaching the device directly
#
# Prints each forward, whether it worked, bytes and round-trip time, what
# the device published and what the collector received, then
# tears everything down (also on Ctrl-C or failure). KEEP=1 leaves it up.
# Needs root, iproute2, nftables and python3; run via `make demo`.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${EDGELINK_BIN:-target/release/edgelink}
DAEMON=${EDGELINKD_BIN:-$(dirname "$BIN")/edgelinkd}
[[ -x $DAEMON ]] || DAEMON=target/release/edgelinkd
KEEP=${KEEP:-}
TAG=elkdemo
NODE=$TAG-node DEV=$TAG-device POD=$TAG-pod CLIENT=$TAG-client PODMV=$TAG-pod-mv
ALL=("$POD" "$PODMV" "$CLIENT" "$DEV" "$NODE")
STATE=/tmp/edgelink-demo
PIDS=()

down() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    # What is left (--down after KEEP=1, a run killed halfway) is found by
    # the lab's namespaces, never by name: other labs on the machine run
    # the same programs (echo.py, edgelinkd).
    local ns pids
    for ns in "${ALL[@]}"; do
        pids=$(ip netns pids "$ns" 2>/dev/null || true)
        # shellcheck disable=SC2086 # one pid a word
        [[ -z $pids ]] || kill $pids 2>/dev/null || true
    done
    for ns in "${ALL[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
    rm -rf "$STATE" "$STATE.log"
}

if [[ ${1:-} == --down ]]; then down; exit 0; fi
for b in "$BIN" "$DAEMON"; do
    [[ -x $b ]] || { echo "demo: $b missing: build first (make demo does)" >&2; exit 1; }
done

cleanup() {
    local rc=$?
    if [[ -n $KEEP && $rc == 0 ]]; then
        cat <<EOT

KEEP=1: the lab is up. Try:
  ip netns exec $NODE $DAEMON status
  ip netns exec $NODE python3 -c 'import urllib.request; print(urllib.request.urlopen("http://127.0.0.1:9310/metrics").read().decode())'
  ip netns exec $CLIENT python3 scripts/lab/echo.py http-get 10.244.1.10 8081 3
  ip netns exec $DEV python3 scripts/lab/echo.py publish $NET1 1883 'device01-01/telemetry temperature=22.0C'
  cat $STATE/collector.log
Tear it down with:  scripts/demo.sh --down
EOT
        return
    fi
    if [[ $rc != 0 && -s $STATE.log ]]; then
        echo "demo: edgelinkd's last log lines:" >&2
        tail -n 20 "$STATE.log" >&2
    fi
    down
    [[ $rc == 0 ]] || echo "demo: FAILED (exit $rc); lab torn down" >&2
}
down
trap cleanup EXIT
trap 'exit 130' INT TERM

say() { printf '\n== %s\n' "$*"; }

cni() { # cni COMMAND CONTAINER NETNS CONFIG-FILE
    ip netns exec $NODE env -i PATH="$PATH" EDGELINK_STATE_DIR="$STATE" CNI_COMMAND="$1" CNI_CONTAINERID="$2" \
        CNI_NETNS="${3:+/var/run/netns/$3}" CNI_IFNAME=net1 CNI_PATH=/usr/lib/cni \
        CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAMESPACE=hil;K8S_POD_NAME=$2" \
        "$BIN" < "$4"
}

get() { # get PATH: the daemon's HTTP endpoint, from inside the node netns
    ip netns exec $NODE python3 -c 'import sys,urllib.request; print(urllib.request.urlopen("http://127.0.0.1:9310"+sys.argv[1], timeout=5).read().decode())' "$1"
}

say "lab: node, device01-01 (172.17.16.120) on the private segment, a cluster client"
mkdir -p "$STATE"
# The node's policy: the uplinks a config may name (docs/configuration.md).
echo '{"uplinks": ["uplink0", "uplink1"]}' > "$STATE/node-policy.json"
for ns in "${ALL[@]}"; do
    ip netns add "$ns"
    ip -n "$ns" link set lo up
done
# The private segment: a switch in the device netns, two node NICs on it.
ip -n $DEV link add sw0 type bridge
ip -n $DEV link set sw0 up
for i in 0 1; do
    ip -n $NODE link add uplink$i type veth peer name port$i netns $DEV
    ip -n $DEV link set port$i master sw0 up
    ip -n $NODE link set uplink$i up
done
ip -n $DEV addr add 172.17.16.120/24 dev sw0
ip netns exec $DEV python3 scripts/lab/echo.py serve 172.17.16.120 8080 & PIDS+=($!)
ip netns exec $DEV python3 scripts/lab/echo.py serve-udp 172.17.16.120 5000 & PIDS+=($!)
ip netns exec $DEV python3 scripts/lab/echo.py serve-http 172.17.16.120 80 & PIDS+=($!)
# The cluster network, reduced to one link: client <-> proxy pod's eth0.
ip -n $POD link add eth0 type veth peer name eth0 netns $CLIENT
ip -n $POD addr add 10.244.1.10/24 dev eth0
ip -n $CLIENT addr add 10.244.1.20/24 dev eth0
ip -n $POD link set eth0 up
ip -n $CLIENT link set eth0 up
# The cluster service the device calls: a collector on the client pod.
ip netns exec $CLIENT python3 scripts/lab/echo.py serve-collect 10.244.1.20 1883 > "$STATE/collector.log" & PIDS+=($!)

say "edgelinkd starts in the node namespace"
ip netns exec $NODE "$DAEMON" run --state-dir "$STATE" --status-addr 127.0.0.1:9310 \
    --log-level info --reconcile-interval 5 --kernel-counters-interval 0.5 2> "$STATE.log" & PIDS+=($!)
for _ in $(seq 100); do [[ -S $STATE/edgelinkd.sock ]] && break; sleep 0.05; done
[[ -S $STATE/edgelinkd.sock ]] || { cat "$STATE.log"; exit 1; }

cat > "$STATE/plant-floor.json" <<JSON
{"cniVersion": "1.0.0", "name": "plant-floor", "type": "edgelink",
 "mode": "bridge", "bridge": "edge0", "uplink": "uplink0", "stateDir": "$STATE",
 "ipam": {"ranges": [[{"subnet": "172.17.16.0/24", "rangeStart": "172.17.16.200",
          "rangeEnd": "172.17.16.229", "gateway": "172.17.16.1"}]], "nodeName": "kedge1"},
 "forwards": [
   {"name": "api",       "protocol": "tcp", "port": 8080, "target": "172.17.16.120:8080",
    "maxConnections": 8, "connectRetries": 2},
   {"name": "web",       "protocol": "tcp", "port": 8081, "target": "172.17.16.120:80"},
   {"name": "telemetry", "protocol": "udp", "port": 5000, "target": "172.17.16.120:5000"},
   {"name": "api-kernel", "protocol": "tcp", "port": 9080, "target": "172.17.16.120:8080",
    "path": "kernel"}],
 "reverse": [
   {"name": "mqtt",      "protocol": "tcp", "port": 1883, "target": "10.244.1.20:1883"}]}
JSON
# Its own range (.230-.240), beside the bridge network's (.200-.229): two
# networks must not share addresses (docs/configuration.md).
cat > "$STATE/plant-floor-mv.json" <<JSON
{"cniVersion": "1.0.0", "name": "plant-floor-mv", "type": "edgelink",
 "mode": "macvlan", "uplink": "uplink1", "stateDir": "$STATE",
 "ipam": {"ranges": [[{"subnet": "172.17.16.0/24", "rangeStart": "172.17.16.230",
          "rangeEnd": "172.17.16.240"}]], "nodeName": "kedge1"}}
JSON

say "ADD: the proxy pod gets net1 (bridge mode), pod-mv gets net1 (macvlan)"
t0=$(date +%s%N); cni ADD proxy-0 $POD "$STATE/plant-floor.json" > "$STATE/proxy-0.result"; t1=$(date +%s%N)
NET1=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["ips"][0]["address"].split("/")[0])' "$STATE/proxy-0.result")
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print("proxy-0 net1:", r["ips"][0]["address"], "interfaces:", [i["name"] for i in r["interfaces"]])' "$STATE/proxy-0.result"
echo "ADD took $(( (t1 - t0) / 1000 )) µs (including ip netns exec)"
cni ADD pod-mv $PODMV "$STATE/plant-floor-mv.json" > /dev/null
python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); c["prevResult"]=json.load(open(sys.argv[2])); print(json.dumps(c))' \
    "$STATE/plant-floor.json" "$STATE/proxy-0.result" > "$STATE/proxy-0.check"
cni CHECK proxy-0 $POD "$STATE/proxy-0.check" && echo "CHECK proxy-0: interface, address, reservation, record and the daemon's listeners are fine"

say "the client (10.244.1.20) talks to device01-01 through the proxy pod's forwards"
# Every line alike: bytes are the clients' payload both ways (TCP: what
# the relay's TO-TARGET + TO-CLIENT count; HTTP: requests and answers,
# head and body; UDP: datagram payloads); rtt is the median of N round
# trips on one connection (or socket).
summary=()
line() { # line NAME PROTO FROM TARGET RESULT...
    printf '%-10s %-4s %-13s -> %-20s %s' "$@"
}
row() { # row NAME PROTO TARGET CLIENT-CMD...
    local name=$1 proto=$2 target=$3; shift 3
    local out bytes rtt
    if out=$(ip netns exec $CLIENT "$@" 2>&1); then
        read -r _ bytes rtt <<<"$out"
        summary+=("$(line "$name" "$proto" 10.244.1.10 "$target" "$(printf 'OK   %8d bytes  rtt median %5d µs of %s' "$bytes" "$rtt" "${*: -1}")")")
    else
        summary+=("$(line "$name" "$proto" 10.244.1.10 "$target" "FAIL $out")")
        FAILED=1
    fi
}
FAILED=0
row api tcp 172.17.16.120:8080 python3 scripts/lab/echo.py ping 10.244.1.10 8080 500
row web http 172.17.16.120:80 python3 scripts/lab/echo.py http-get 10.244.1.10 8081 100
row telemetry udp 172.17.16.120:5000 python3 scripts/lab/echo.py udp-ping 10.244.1.10 5000 500
# The same device port through the pod's own kernel (nftables DNAT that
# edgelinkd installed in the pod's netns), beside the relay.
row api-kernel tcp 172.17.16.120:8080 python3 scripts/lab/echo.py ping 10.244.1.10 9080 500
out=$(ip netns exec $PODMV python3 scripts/lab/echo.py ping 172.17.16.120 8080 100)
read -r _ bytes rtt <<<"$out"
summary+=("$(line direct tcp "pod-mv net1" 172.17.16.120:8080 "$(printf 'OK   %8d bytes  rtt median %5d µs of 100  (macvlan, no relay)' "$bytes" "$rtt")")")
printf '%s\n' "${summary[@]}"

say "the other way: device01-01 publishes to the collector (10.244.1.20:1883) through the pod's reverse forward"
# The device has no route into the cluster: it dials the pod's net1
# address, and edgelinkd connects to the collector from inside the pod, as
# the pod (the collector sees 10.244.1.10).
MSG="device01-01/telemetry temperature=21.5C seq=$RANDOM"
if out=$(ip netns exec $DEV python3 scripts/lab/echo.py publish "$NET1" 1883 "$MSG" 2>&1); then
    read -r _ bytes rtt <<<"$out"
    echo "device01-01 (172.17.16.120) published to $NET1:1883: \"$MSG\" (acked, rtt $rtt µs)"
else
    echo "device01-01 could not publish to $NET1:1883: ${out##*$'\n'}"
fi
got=
for _ in $(seq 50); do
    got=$(grep -F -- "$MSG" "$STATE/collector.log" || true)
    [[ -n $got ]] && break
    sleep 0.1
done
if [[ -n $got ]]; then
    echo "collector 10.244.1.20:1883 received $got"
    # One round trip, and the first of its connection: it includes
    # edgelinkd's connect to the collector, made when the device connected.
    summary+=("$(line mqtt tcp "$NET1" 10.244.1.20:1883 "$(printf 'OK   %8d bytes  rtt        %5d µs of 1    (reverse, with the relay'"'"'s connect)' "$bytes" "$rtt")")")
else
    echo "collector 10.244.1.20:1883 received nothing; its log:"; cat "$STATE/collector.log"
    summary+=("$(line mqtt tcp "$NET1" 10.244.1.20:1883 "FAIL the line did not arrive (reverse: device01-01 -> collector)")")
    FAILED=1
fi
# Nothing else of the cluster is reachable from the segment.
if out=$(ip netns exec $DEV timeout 5 python3 scripts/lab/echo.py publish 10.244.1.20 1883 "$MSG" 2>&1); then
    echo "device01-01 reached 10.244.1.20:1883 directly: it should not ($out)"
    FAILED=1
else
    echo "device01-01 -> 10.244.1.20:1883 directly: refused (${out##*: }): only the pod's reverse port leads into the cluster"
fi

# The kernel path's counters are read from nft every 0.5 s here.
sleep 0.6
say "edgelinkd status (also: /status as JSON, /metrics, /healthz on 127.0.0.1:9310 in $NODE)"
# Exit status 2: something shown is not well (its NOT WELL lines say what).
st=$(ip netns exec $NODE "$DAEMON" status --status-addr 127.0.0.1:9310) || { [[ $? == 2 ]] || FAILED=1; }
echo "$st"
grep -q 'mqtt/tcp (reverse)' <<<"$st" || { echo "demo: the status does not list the reverse forward mqtt/tcp" >&2; FAILED=1; }
get /metrics | grep -E '^edgelink_(bytes_to_target|connections)_total' | head -6

echo "(TO-TARGET/TO-CLIENT: payload bytes for relayed forwards; the kernel path's are nftables' packet counts, IP and TCP headers and the handshake included, so more for the same traffic)"

if [[ -n $KEEP ]]; then
    say "summary"
    printf '%s\n' "${summary[@]}"
    [[ $FAILED == 0 ]]
    exit
fi

say "DEL: the listeners close, addresses and records are released"
cni DEL proxy-0 $POD "$STATE/proxy-0.check"
cni DEL pod-mv $PODMV "$STATE/plant-floor-mv.json"
sleep 0.3
left=$(get /status | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["attachments"]))')
echo "attachments served after DEL: $left"
[[ $left == 0 ]]

say "summary"
printf '%s\n' "${summary[@]}"
[[ $FAILED == 0 ]]
