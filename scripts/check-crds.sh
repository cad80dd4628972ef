#!/usr/bin/env bash
# The operator's CRDs against a real API server (issue 23): etcd and
# kube-apiserver from BIN_DIR in a network namespace of their own
# (crdcheck-<pid>, loopback only), a throwaway CA and client certificate
# from openssl in a temporary directory; nothing else is touched.
#
#   scripts/check-crds.sh BIN_DIR     (root; BIN_DIR has etcd, kube-apiserver, kubectl)
#
# Kubernetes 1.31 or later: daemonset/operator/crds.yaml applies, each bad
# Device or EdgeNetwork below is refused with its CEL rule's message and
# each good one is accepted (server-side dry run).
# Before 1.31 (1.20): what kubectl and the server make of crds.yaml (its
# x-kubernetes-validations), crds-1.20.yaml applies, the good objects are
# accepted and so are the bad ones only CEL refuses: the controller
# reports those in status.
#
# One PASS/FAIL line per case, then "N passed, M failed". Everything it
# started, the namespace and the temporary directory go on exit.
set -euo pipefail

BIN=${1:?usage: scripts/check-crds.sh BIN_DIR}
BIN=$(cd "$BIN" && pwd)
REPO=$(cd "$(dirname "$0")/.." && pwd)
CRDS=$REPO/daemonset/operator/crds.yaml
CRDS_OLD=$REPO/daemonset/operator/crds-1.20.yaml
NS=crdcheck-$$
T0=$SECONDS

for f in etcd kube-apiserver kubectl; do
    [[ -x $BIN/$f ]] || { echo "check-crds: no $BIN/$f" >&2; exit 1; }
done
command -v openssl >/dev/null || { echo "check-crds: openssl is not installed" >&2; exit 1; }
[[ $(id -u) == 0 ]] || { echo "check-crds: needs root (ip netns)" >&2; exit 1; }
if ip netns list | grep -qw "$NS"; then
    echo "check-crds: network namespace $NS exists already" >&2
    exit 1
fi

TMP=$(mktemp -d /tmp/check-crds.XXXXXX)
PIDS=()
NS_MADE=0

# stop PID: TERM, up to 10 s, then KILL; reaped.
stop() {
    local pid=$1 i
    kill -TERM "$pid" 2>/dev/null || return 0
    for ((i = 0; i < 100; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
cleanup() {
    local i pid
    for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do stop "${PIDS[i]}"; done
    if ((NS_MADE)); then
        # anything else still in the namespace is ours too
        for pid in $(ip netns pids "$NS" 2>/dev/null); do stop "$pid"; done
        ip netns delete "$NS" 2>/dev/null || echo "check-crds: ip netns delete $NS failed" >&2
    fi
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

in_ns() { ip netns exec "$NS" "$@"; }
kc() { timeout 60 ip netns exec "$NS" "$BIN/kubectl" --kubeconfig "$TMP/admin.kubeconfig" --request-timeout 30s "$@"; }
# until_ok SECONDS CMD...: CMD until it succeeds, at most SECONDS.
until_ok() {
    local end=$((SECONDS + $1))
    shift
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < end)) || return 1
        sleep 1
    done
}
# started NAME PID LOG SECONDS CMD...: wait for CMD while PID runs, at
# most SECONDS; else show the end of NAME's LOG and fail.
started() {
    local name=$1 pid=$2 log=$3 secs=$4 end=$((SECONDS + $4))
    shift 4
    until "$@" >/dev/null 2>&1; do
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "check-crds: $name exited; the end of its log:" >&2
            break
        elif ((SECONDS >= end)); then
            echo "check-crds: $name not ready in $secs s; the end of its log:" >&2
            break
        fi
        sleep 1
    done
    "$@" >/dev/null 2>&1 && return 0
    tail -n 20 "$log" >&2
    exit 1
}

# --- a CA, the server's certificate, an admin client (system:masters), the service account key
pki() {
    local p=$TMP/pki
    mkdir -p "$p"
    openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=crdcheck-ca \
        -keyout "$p/ca.key" -out "$p/ca.crt" 2>/dev/null
    # cert NAME SUBJECT EXT
    cert() {
        openssl req -new -newkey rsa:2048 -nodes -subj "$2" -keyout "$p/$1.key" -out "$p/$1.csr" 2>/dev/null
        printf '%s\n' "$3" >"$p/$1.ext"
        openssl x509 -req -in "$p/$1.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" -CAcreateserial -days 1 \
            -extfile "$p/$1.ext" -out "$p/$1.crt" 2>/dev/null
    }
    cert apiserver /CN=kube-apiserver \
        "$(printf 'extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost')"
    cert admin /O=system:masters/CN=admin "extendedKeyUsage=clientAuth"
    openssl genrsa -out "$p/sa.key" 2048 2>/dev/null
    openssl rsa -in "$p/sa.key" -pubout -out "$p/sa.pub" 2>/dev/null
    cat >"$TMP/admin.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: crdcheck
  cluster: {server: "https://127.0.0.1:6443", certificate-authority: "$p/ca.crt"}
users:
- name: admin
  user: {client-certificate: "$p/admin.crt", client-key: "$p/admin.key"}
contexts:
- name: crdcheck
  context: {cluster: crdcheck, user: admin}
current-context: crdcheck
KC
}

# --- etcd and kube-apiserver on the namespace's loopback
control_plane() {
    local p=$TMP/pki api
    ip netns add "$NS"
    NS_MADE=1
    ip -n "$NS" link set lo up
    # `ip netns exec` execs the command: $! is its pid.
    ip netns exec "$NS" "$BIN/etcd" --name crdcheck --data-dir "$TMP/etcd" \
        --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
        --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
        --initial-cluster crdcheck=http://127.0.0.1:2380 >"$TMP/etcd.log" 2>&1 &
    PIDS+=($!)
    started etcd "$!" "$TMP/etcd.log" 30 in_ns timeout 5 bash -c 'exec 3<>/dev/tcp/127.0.0.1/2379'
    # No Endpoints for the `kubernetes` Service (a loopback address is
    # refused there): --endpoint-reconciler-type none.
    ip netns exec "$NS" "$BIN/kube-apiserver" --etcd-servers http://127.0.0.1:2379 \
        --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port 6443 \
        --service-cluster-ip-range 10.0.0.0/24 --endpoint-reconciler-type none \
        --client-ca-file "$p/ca.crt" --tls-cert-file "$p/apiserver.crt" --tls-private-key-file "$p/apiserver.key" \
        --service-account-key-file "$p/sa.pub" --service-account-signing-key-file "$p/sa.key" \
        --service-account-issuer https://kubernetes.default.svc >"$TMP/apiserver.log" 2>&1 &
    api=$!
    PIDS+=("$api")
    started kube-apiserver "$api" "$TMP/apiserver.log" 120 kc get --raw /readyz
    started "the default namespace" "$api" "$TMP/apiserver.log" 30 kc get namespace default
}

PASS=0 FAIL=0
pass() { echo "PASS $1"; PASS=$((PASS + 1)); }
fail() { echo "FAIL $1"; FAIL=$((FAIL + 1)); }
note() { printf '     %s\n' "$@"; }
# server_says OUT: kubectl's output on one line, without its own prefix
server_says() { tr '\n' ' ' <<<"$1" | sed -e 's/^The [A-Za-z]* "[^"]*" is invalid: //' -e 's/ *$//'; }

# --- the objects ---------------------------------------------------------------------------------
dev() { # dev NAME SPEC: a Device in namespace default
    printf 'apiVersion: edgelink.io/v1alpha1\nkind: Device\nmetadata: {name: %s, namespace: default}\nspec:\n%s\n' "$1" "$2"
}
net() { # net NAME SPEC: an EdgeNetwork
    printf 'apiVersion: edgelink.io/v1alpha1\nkind: EdgeNetwork\nmetadata: {name: %s}\nspec:\n%s\n' "$1" "$2"
}
ON='  nodeName: kedge1
  network: plant-floor'
AT='  address: 172.17.16.120'
PORTS='  ports: [{name: api, protocol: tcp, port: 8080}, {name: telemetry, protocol: udp, port: 5000}]'
RANGES='  ipam: {ranges: [{node: kedge1, subnet: 172.17.16.0/24, rangeStart: 172.17.16.200, rangeEnd: 172.17.16.224}]}'

GOOD=(
    "device01-01 (cni-conf)|$(sed 's/namespace: hil/namespace: default/' "$REPO/cni-conf/device01-01.yaml")"
    "plant-floor (cni-conf)|$(cat "$REPO/cni-conf/edgenetwork-plant-floor.yaml")"
    "relay keys on a relayed TCP port, kernel UDP port, reverse entries|$(dev good-relay "$ON
$AT
  ports:
    - {name: api, protocol: tcp, port: 8080, maxConnections: 8, queueTimeoutMs: 1000, connectRetries: 0, proxyProtocol: v2, path: relay}
    - {name: telemetry, protocol: udp, port: 5000, path: kernel}
  reverse:
    - {name: mqtt, port: 1883, service: {name: mqtt, port: 1883}, idleTimeoutMs: 0}
    - {name: collector, protocol: udp, port: 9000, service: {name: good-relay, namespace: telemetry, port: syslog}}
    - {name: mock, port: 8443, target: \"[fd00::1]:65535\", idleTimeoutMs: 1000, proxyProtocol: v1}
    - {name: mock-udp, protocol: udp, port: 8443, target: \"mock.hil.svc:1\"}
  virtualAddresses: [172.17.16.60, 'fd00:17::60']")"
    "link-local address, nodeSelector|$(dev good-selector "  nodeSelector: {edgelink.io/segment: plant-floor}
  network: plant-floor
  address: 169.254.10.20
$PORTS")"
    "macvlan with uplink, IPv6 range and gateway|$(net good-macvlan "  mode: macvlan
  uplink: eth1
  macvlanMode: vepa
  ipam:
    ranges:
      - {node: kedge1, subnet: 172.17.16.0/24, rangeStart: 172.17.16.10, rangeEnd: 172.17.16.10, gateway: 172.17.16.1}
      - {node: kedge1, subnet: 'fd00:17::/64', rangeStart: 'fd00:17::100', rangeEnd: 'fd00:17::1ff', gateway: 'fd00:17::1'}")"
    "null for absent (UDP maxConnections, macvlan's bridge, rangeStart)|$(dev good-null "$ON
$AT
  ports: [{name: telemetry, protocol: udp, port: 5000, maxConnections: null}]")
---
$(net good-null "  mode: macvlan
  uplink: eth1
  bridge: null
  ipam: {ranges: [{node: kedge1, subnet: 172.17.16.0/24, rangeStart: null, rangeEnd: 172.17.16.9}]}")"
)

# NAME|FIELD|MESSAGE|YAML: refused by Kubernetes 1.31 and later on FIELD
# (`<nil>` for a rule on the object) with MESSAGE
BAD=(
    "Device name not a DNS-1035 label|<nil>|metadata.name: cannot name a Service and its proxy pod: it must be a DNS-1035 label|$(dev 1device "$ON
$AT
$PORTS")"
    "Device name of 62 characters|<nil>|metadata.name: cannot name a Service and its proxy pod: it must be a DNS-1035 label (a-z first, then a-z, 0-9 and -, not ending in -) of at most 61 characters|$(dev "$(printf 'd%.0s' {1..62})" "$ON
$AT
$PORTS")"
    "empty nodeSelector|spec.nodeSelector|is empty: it would select every node|$(dev bad "  nodeSelector: {}
  network: plant-floor
$AT
$PORTS")"
    "health path on a tcp probe|spec.health.path|Forbidden: is for probe type http only|$(dev bad "$ON
$AT
$PORTS
  health: {type: tcp, path: /healthz}")"
    "udp health without payload|spec.health.payload|Required value: is required with probe type udp (the datagram sent)|$(dev bad "$ON
$AT
$PORTS
  health: {type: udp}")"
    "health timeout longer than the interval|spec.health.timeoutSeconds|is longer than intervalSeconds (default 2)|$(dev bad "$ON
$AT
$PORTS
  health: {intervalSeconds: 1, timeoutSeconds: 2}")"
    "virtual address without reverse entries|spec.virtualAddresses|needs reverse entries: nothing else listens on a virtual address|$(dev bad "$ON
$AT
$PORTS
  virtualAddresses: [172.17.16.60]")"
    "two IPv4 virtual addresses|spec.virtualAddresses|at most one IPv4 and one IPv6 virtual address|$(dev bad "$ON
$AT
$PORTS
  reverse: [{name: mqtt, port: 1883, target: \"10.96.0.10:1883\"}]
  virtualAddresses: [172.17.16.60, 172.17.16.61]")"
    "the device's own address as the virtual address|spec.virtualAddresses|names the device's own address|$(dev bad "$ON
$AT
$PORTS
  reverse: [{name: mqtt, port: 1883, target: \"10.96.0.10:1883\"}]
  virtualAddresses: [172.17.16.120]")"
    "multicast address|spec.address|224.0.0.1 is not a unicast address (unspecified, loopback, multicast or broadcast)|$(dev bad "$ON
  address: 224.0.0.1
$PORTS")"
    "loopback address|spec.address|::1 is not a unicast address (unspecified, loopback, multicast or broadcast)|$(dev bad "$ON
  address: '::1'
$PORTS")"
    "two ports on 80/tcp|spec.ports|two entries have the same port and protocol|$(dev bad "$ON
$AT
  ports: [{name: api, protocol: tcp, port: 80}, {name: web, protocol: tcp, port: 80}]")"
    "maxConnections on a UDP port|spec.ports[1].maxConnections|Forbidden: is only valid with protocol tcp (telemetry is udp)|$(dev bad "$ON
$AT
  ports: [{name: api, protocol: tcp, port: 8080}, {name: telemetry, protocol: udp, port: 5000, maxConnections: 4}]")"
    "proxyProtocol on the kernel path|spec.ports[0].proxyProtocol|Forbidden: needs the relay: it cannot be set with path kernel (api)|$(dev bad "$ON
$AT
  ports: [{name: api, protocol: tcp, port: 8080, path: kernel, proxyProtocol: v1}]")"
    "reverse idleTimeoutMs on UDP|spec.reverse[0].idleTimeoutMs|Forbidden: is only valid with protocol tcp (syslog is udp)|$(dev bad "$ON
$AT
$PORTS
  reverse: [{name: syslog, protocol: udp, port: 514, target: 'collector:514', idleTimeoutMs: 5000}]")"
    "reverse idleTimeoutMs 500|spec.reverse[0].idleTimeoutMs|is not 0 (never) or in 1000..604800000|$(dev bad "$ON
$AT
$PORTS
  reverse: [{name: mqtt, port: 1883, target: 'mqtt:1883', idleTimeoutMs: 500}]")"
    "reverse target port 70000|spec.reverse[0].target|mqtt:70000: the port is not in 1..65535|$(dev bad "$ON
$AT
$PORTS
  reverse: [{name: mqtt, port: 1883, target: 'mqtt:70000'}]")"
    "reverse name of a port|spec.reverse|an entry has the name of a port: a name is unique across ports and reverse|$(dev bad "$ON
$AT
$PORTS
  reverse: [{name: api, port: 1883, target: 'mqtt:1883'}]")"
    "reverse on a port's port/protocol|spec.reverse|an entry has the port and protocol of a port|$(dev bad "$ON
$AT
$PORTS
  reverse: [{name: mqtt, port: 8080, target: 'mqtt:1883'}]")"
    "two reverse entries on 1883/tcp|spec.reverse|two entries have the same port and protocol|$(dev bad "$ON
$AT
$PORTS
  reverse: [{name: mqtt, port: 1883, target: 'mqtt:1883'}, {name: mqtt2, port: 1883, protocol: tcp, target: 'mqtt2:1883'}]")"
    "reverse naming the Device's own Service|spec.reverse|a service names the Device's own Service: the device would call itself through its proxy|$(dev loop "$ON
$AT
$PORTS
  reverse: [{name: mqtt, port: 1883, service: {name: loop}}]")"
    "macvlan without uplink|spec.uplink|Required value: is required with mode macvlan (the macvlan master)|$(net bad "  mode: macvlan
$RANGES")"
    "bridge on macvlan|spec.bridge|Forbidden: is only valid with mode bridge|$(net bad "  mode: macvlan
  uplink: eth1
  bridge: edge0
$RANGES")"
    "vlan on macvlan|spec.vlan|Forbidden: is only valid with mode bridge|$(net bad "  mode: macvlan
  uplink: eth1
  vlan: 10
$RANGES")"
    "macvlanMode on bridge (the default mode)|spec.macvlanMode|Forbidden: is only valid with mode macvlan|$(net bad "  macvlanMode: vepa
$RANGES")"
    "rangeStart outside the subnet|spec.ipam.ranges[0].rangeStart|172.17.17.1 is outside the subnet 172.17.16.0/24|$(net bad "  ipam: {ranges: [{node: kedge1, subnet: 172.17.16.0/24, rangeStart: 172.17.17.1}]}")"
    "IPv6 gateway outside the subnet|spec.ipam.ranges[0].gateway|fd00:18::1 is outside the subnet fd00:17::/64|$(net bad "  ipam: {ranges: [{node: kedge1, subnet: 'fd00:17::/64', gateway: 'fd00:18::1'}]}")"
    "rangeEnd before rangeStart|spec.ipam.ranges[0]|rangeEnd 172.17.16.9 is before rangeStart 172.17.16.20|$(net bad "  ipam: {ranges: [{node: kedge1, subnet: 172.17.16.0/24, rangeStart: 172.17.16.20, rangeEnd: 172.17.16.9}]}")"
)

# try YAML: a server-side dry run of `kubectl apply`; its output in OUT
try() { OUT=$(kc apply --dry-run=server -f - <<<"$1" 2>&1); }

check_good() {
    local i
    for i in "${GOOD[@]}"; do
        if try "${i#*|}"; then pass "accepted: ${i%%|*}"; else
            fail "accepted: ${i%%|*}"
            note "$(server_says "$OUT")"
        fi
    done
}
# check_bad CEL: CEL 1 refused with the message, 0 accepted (the controller's to report)
check_bad() {
    local i name field msg yaml
    for i in "${BAD[@]}"; do
        name=${i%%|*} i=${i#*|}
        field=${i%%|*} i=${i#*|}
        msg=${i%%|*} yaml=${i#*|}
        if (($1)); then
            if try "$yaml"; then
                fail "refused: $name (accepted)"
            elif [[ $OUT == *"$field: "* && $OUT == *"$msg"* ]]; then
                pass "refused: $name"
                note "$(server_says "$OUT")"
            else
                fail "refused: $name (not on $field with \"$msg\")"
                note "$(server_says "$OUT")"
            fi
        elif try "$yaml"; then
            pass "accepted without CEL (the controller reports it): $name"
        else
            fail "accepted without CEL: $name"
            note "$(server_says "$OUT")"
        fi
    done
}
rules_stored() { # rules_stored CRD: how many rules the server keeps
    kc get crd "$1" -o json | grep -c '"rule":' || true
}
crd_gone() { ! kc get crd devices.edgelink.io; }
established() {
    kc wait --for condition=established --timeout 30s crd/devices.edgelink.io crd/edgenetworks.edgelink.io >/dev/null
}

# --- 1.31 and later: crds.yaml with its rules
check_cel() {
    if OUT=$(kc apply -f "$CRDS" 2>&1) && established; then
        pass "crds.yaml applied, both CRDs established"
        note "$(server_says "$OUT")"
    else
        fail "crds.yaml applied"
        note "$(server_says "$OUT")"
        return
    fi
    local d e
    d=$(rules_stored devices.edgelink.io) e=$(rules_stored edgenetworks.edgelink.io)
    if ((d > 0 && e > 0)); then pass "the server keeps the rules ($d on Device, $e on EdgeNetwork)"; else
        fail "the server keeps the rules ($d on Device, $e on EdgeNetwork)"
    fi
    check_good
    check_bad 1
}

# --- before 1.31: what becomes of crds.yaml, then crds-1.20.yaml
check_old() {
    if OUT=$(kc apply -f "$CRDS" 2>&1); then
        fail "kubectl apply -f crds.yaml refused by kubectl's validation (it applied)"
    else
        pass "kubectl apply -f crds.yaml refused"
    fi
    note "$(server_says "$OUT" | cut -c1-400)"
    if OUT=$(kc apply --validate=false -f "$CRDS" 2>&1) && established; then
        local d e
        d=$(rules_stored devices.edgelink.io) e=$(rules_stored edgenetworks.edgelink.io)
        if ((d + e == 0)); then
            pass "kubectl apply --validate=false -f crds.yaml: accepted, the rules dropped by the server"
        else
            fail "kubectl apply --validate=false -f crds.yaml: the server kept $d + $e rules"
        fi
        note "$(server_says "$OUT")"
    else
        fail "kubectl apply --validate=false -f crds.yaml"
        note "$(server_says "$OUT")"
    fi
    kc delete -f "$CRDS" --wait=true --timeout 60s >/dev/null 2>&1 || true
    until_ok 30 crd_gone || true
    if OUT=$(kc apply -f "$CRDS_OLD" 2>&1) && established; then
        pass "crds-1.20.yaml applied, both CRDs established"
        note "$(server_says "$OUT")"
    else
        fail "crds-1.20.yaml applied"
        note "$(server_says "$OUT")"
        return
    fi
    check_good
    check_bad 0
}

pki
control_plane
VERSION=$(kc get --raw /version | sed -n 's/.*"gitVersion": *"\([^"]*\)".*/\1/p')
MINOR=$(kc get --raw /version | sed -n 's/.*"minor": *"\([0-9]*\).*/\1/p')
echo "kube-apiserver $VERSION in netns $NS, ready $((SECONDS - T0)) s after the start"
kc create namespace hil >/dev/null
kc create namespace telemetry >/dev/null
if ((MINOR >= 31)); then check_cel; else check_old; fi
echo "$PASS passed, $FAIL failed in $((SECONDS - T0)) s ($VERSION)"
((FAIL == 0))
