# shellcheck shell=bash
# Check 10 of `make e2e-kube` (issue 14, reverse forwards): the device calls
# a cluster Service through a proxy pod. Sourced by e2e.sh after check 9, on
# the same cluster, with its helpers (kc, check, note, until_ok, on_node,
# in_pod_netns, pod_netns, ds_pod, NET1...). Also makes the collector that
# e2e-operator.sh's O12 calls; reverse_cleanup stops its UDP side.
#
#   device01-01 netns --TCP/UDP--> proxy pod net1:9000 (edgelinkd, reverse)
#     --from the pod's eth0--> Service collector ClusterIP:9000 --> pod collector
#
# The collector: a busybox pod. TCP is its own `nc -ll -e` (one sh per
# connection: the line it got and the peer netstat shows, to the container's
# log and back to the caller). busybox has no UDP server, so UDP is the
# host's python3 run in the collector pod's network namespace (as the UDP
# client of check 3c), answering the same way and writing a log under
# $RUN/logs. On 1.36 the collector runs on kw1 and the NAD is
# cni-conf/nad-reverse.yaml as shipped: edgelinkd resolves its target
# collector.hil.svc.cluster.local:9000 through the cluster's DNS. The 1.20
# lab has no DNS: the target is replaced by the ClusterIP.

REV_NAD=device01-01-reverse
REV_POD=device01-01-reverse
REV_PORT=9000
# an address on the segment no device has, for the source check of 10d
FOREIGN_IP=172.17.16.126
COLL_IP=
COLL_UDP_PID=
COLL_UDP_LOG=$RUN/logs/e2e-collector-udp.log

# dev_call tcp|udp HOST PORT PAYLOAD [SOURCE]: from the device's namespace;
# prints the answer's first line, or why there is none (and fails)
dev_call() {
  ip netns exec "$DEVICE_NS" timeout 20 python3 -c '
import socket, sys
proto, host, port, payload = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
src = sys.argv[5] if len(sys.argv) > 5 else None
data = b""
try:
    if proto == "tcp":
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(5)
        if src:
            s.bind((src, 0))
        s.connect((host, port))
        s.sendall(payload.encode() + b"\n")
        while not data.endswith(b"\n"):
            b = s.recv(4096)
            if not b:
                break
            data += b
    else:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.settimeout(2)
        if src:
            s.bind((src, 0))
        for _ in range(3):
            s.sendto(payload.encode() + b"\n", (host, port))
            try:
                data, _ = s.recvfrom(65536)
                break
            except socket.timeout:
                pass
except OSError as e:
    print("%s: %s" % (e.__class__.__name__, e))
    sys.exit(1)
if not data:
    print("no answer")
    sys.exit(1)
print(data.decode(errors="replace").splitlines()[0])
' "$@"
}

# The UDP side of the collector, in its pod's netns, bounded (25 min).
COLL_UDP_PY='
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", int(sys.argv[1])))
log = open(sys.argv[2], "a", buffering=1)
while True:
    b, peer = s.recvfrom(65536)
    line = "collector: [%s] from %s:%d" % (b.decode(errors="replace").strip(), peer[0], peer[1])
    log.write(line + "\n")
    s.sendto(line.encode() + b"\n", peer)
'
reverse_cleanup() {
  if [[ -n $COLL_UDP_PID ]]; then kill "$COLL_UDP_PID" 2>/dev/null || true; wait "$COLL_UDP_PID" 2>/dev/null || true; fi
  COLL_UDP_PID=
}

# The collector pod and its Service; COLL_IP its ClusterIP.
collector_up() {
  local ns
  sed -e "s|@IMAGE@|$CLIENT_IMAGE|" -e "s|@NODE@|$CLIENT_NODE|" <<'YAML' | kc -n hil apply -f - >/dev/null || return 1
apiVersion: v1
kind: Pod
metadata:
  name: collector
  labels: {app.kubernetes.io/name: collector}
spec:
  nodeName: @NODE@
  containers:
  - name: collector
    image: @IMAGE@
    imagePullPolicy: Never
    # one sh per connection: its stdin and stdout are the connection,
    # its stderr the container's log
    command: [nc, -ll, -p, "9000", -e, sh, -c]
    args:
    - |
      read -r l
      p=$(netstat -tn | awk '$4 ~ /:9000$/ && $6 == "ESTABLISHED" {print $5; exit}')
      echo "collector: [$l] from $p" >&2
      echo "collector: [$l] from $p"
---
apiVersion: v1
kind: Service
metadata: {name: collector}
spec:
  selector: {app.kubernetes.io/name: collector}
  ports:
  - {name: ingest, protocol: TCP, port: 9000}
  - {name: ingest-udp, protocol: UDP, port: 9000}
YAML
  kc -n hil wait --for condition=Ready --timeout 60s pod/collector >/dev/null || return 1
  COLL_IP=$(kc -n hil get svc collector -o jsonpath='{.spec.clusterIP}')
  ns=$(pod_netns hil collector)
  [[ -n $COLL_IP && -n $ns ]] || return 1
  : >"$COLL_UDP_LOG"
  # not through in_pod_netns: a function would run in a subshell, and $!
  # be that subshell, not timeout (which passes the TERM on to python3)
  nsenter --mount="$(netns_mnt "$ns")" nsenter --net="/run/netns/$ns" \
    timeout 1500 python3 -c "$COLL_UDP_PY" "$REV_PORT" "$COLL_UDP_LOG" >/dev/null 2>&1 &
  COLL_UDP_PID=$!
  note "Service collector ClusterIP $COLL_IP (ingest 9000/tcp, ingest-udp 9000/udp); pod collector $(kc -n hil get pod collector -o jsonpath='{.status.podIP}') on $(kc -n hil get pod collector -o jsonpath='{.spec.nodeName}'), netns $ns"
}

# rev_field POD FORWARD FIELD: from edgelinkd's /status (fwd_field of
# e2e-operator.sh is defined later)
rev_field() {
  ip netns exec "$NODE_NS" curl -fsS --max-time 5 http://127.0.0.1:9310/status | python3 -c '
import json, sys
pod, fwd, field = sys.argv[1:]
for a in json.load(sys.stdin)["attachments"]:
    if a.get("podName") == pod:
        for f in a["forwards"]:
            if f["name"] == fwd:
                v = f.get(field)
                print(",".join(v) if isinstance(v, list) else v); sys.exit(0)
sys.exit(1)' "$@"
}

# ds_status_has TEXT: `edgelinkd status` in the DaemonSet pod shows TEXT
# (its exit status 2, a target unreachable, is no failure here)
ds_status_has() {
  local out
  out=$(kc -n edgelink-system exec "$DS_POD" -c edgelinkd -- edgelinkd status 2>/dev/null) || true
  [[ $out == *"$1"* ]]
}

REV_NET1=""
REV_POD_IP=""
c10a_setup() {
  local conf st
  collector_up || { note "collector not up"; return 1; }
  REV_TARGET=collector.hil.svc.cluster.local:$REV_PORT
  [[ $KUBE == 1.20 ]] && REV_TARGET=$COLL_IP:$REV_PORT
  sed "s|collector.hil.svc.cluster.local:9000|$REV_TARGET|g" "$REPO/cni-conf/nad-reverse.yaml" |
    kc apply -f - >/dev/null || return 1
  kc -n hil apply -f - >/dev/null <<YAML || return 1
apiVersion: v1
kind: Pod
metadata:
  name: $REV_POD
  annotations: {k8s.v1.cni.cncf.io/networks: '[{"name": "$REV_NAD", "interface": "net1"}]'}
spec:
  nodeSelector: {edgelink.io/edge: "true", kubernetes.io/hostname: $NODE}
  automountServiceAccountToken: false
  enableServiceLinks: false
  containers:
  - {name: pause, image: registry.k8s.io/pause:3.9}
YAML
  kc -n hil wait --for condition=Ready --timeout 90s "pod/$REV_POD" >/dev/null || return 1
  conf=$(kc -n hil get network-attachment-definitions "$REV_NAD" -o jsonpath='{.spec.config}')
  note "NAD $REV_NAD reverse: $(python3 -c 'import json,sys; print(", ".join("%s %s/%s -> %s" % (r["name"], r["port"], r["protocol"], r["target"]) for r in json.loads(sys.argv[1])["reverse"]))' "$conf")"
  REV_NET1=$(kc -n hil exec "$REV_POD" -- ip -4 -o addr show net1 | awk '{print $4}')
  REV_NET1=${REV_NET1%/*}
  REV_POD_IP=$(kc -n hil get pod "$REV_POD" -o jsonpath='{.status.podIP}')
  note "proxy pod $REV_POD: eth0 $REV_POD_IP, net1 $REV_NET1"
  until_ok 30 is listening rev_field "$REV_POD" collector listener || { note "collector not listening"; return 1; }
  until_ok 30 is listening rev_field "$REV_POD" collector-udp listener || return 1
  DS_POD=$(ds_pod)
  # a name: until it is resolved (edgelinkd status shows "name = address")
  if [[ $REV_TARGET != "$COLL_IP:$REV_PORT" ]]; then
    until_ok 30 ds_status_has "= $COLL_IP:$REV_PORT" || note "the name is not resolved after 30 s"
  fi
  st=$(kc -n edgelink-system exec "$DS_POD" -c edgelinkd -- edgelinkd status) || [ $? -eq 2 ] || return 1
  grep -E "$REV_POD|POD" <<<"$st" | sed 's/^/     | /'
  note "/status collector: direction $(rev_field "$REV_POD" collector direction), listen $(rev_field "$REV_POD" collector listen), allowedSources $(rev_field "$REV_POD" collector allowedSources); collector-udp: listen $(rev_field "$REV_POD" collector-udp listen), allowedSources $(rev_field "$REV_POD" collector-udp allowedSources)"
  # a name is shown with what it resolved to
  local shown=$REV_TARGET
  [[ $REV_TARGET == "$COLL_IP:$REV_PORT" ]] || shown="$REV_TARGET = $COLL_IP:$REV_PORT"
  [[ $conf == *"\"$REV_TARGET\""* && -n $REV_NET1 && $REV_NET1 == 172.17.16.* ]] &&
    grep -Eq "hil/$REV_POD +$REV_NET1 +collector/tcp \(reverse\) +$shown +listening" <<<"$st" &&
    grep -Eq "hil/$REV_POD +$REV_NET1 +collector-udp/udp \(reverse\) +$shown +listening" <<<"$st" &&
    [[ $(rev_field "$REV_POD" collector direction) == reverse ]] &&
    [[ $(rev_field "$REV_POD" collector listen) == "$REV_NET1:$REV_PORT" ]] &&
    [[ $(rev_field "$REV_POD" collector-udp allowedSources) == 172.17.16.0/24 ]]
}
# the answer must come from the collector and name the proxy pod's eth0 as
# the peer, not the device
from_pod() { [[ $1 == "collector: [$2] from "*"$3:"* && $1 != *"$DEVICE_IP"* ]]; }
c10b_tcp() {
  local word out logs
  word=tcp-reading-$RANDOM
  out=$(dev_call tcp "$REV_NET1" "$REV_PORT" "$word") || { note "device -> $REV_NET1:$REV_PORT/tcp: $out"; return 1; }
  note "device $DEVICE_IP -> $REV_NET1:$REV_PORT/tcp, answer: $out"
  until_ok 10 grep_logs "$word" || true
  logs=$(kc -n hil logs collector | grep -F "$word" || true)
  note "kubectl logs collector: $logs"
  from_pod "$out" "$word" "$REV_POD_IP" && from_pod "$logs" "$word" "$REV_POD_IP" &&
    until_ok 20 at_least 1 rev_field "$REV_POD" collector totalConnections &&
    note "/status collector: $(rev_field "$REV_POD" collector totalConnections) connections, $(rev_field "$REV_POD" collector bytesToTarget) bytes to the Service"
}
grep_logs() { kc -n hil logs collector | grep -qF "$1"; }
c10c_udp() {
  local word out
  word=udp-reading-$RANDOM
  out=$(dev_call udp "$REV_NET1" "$REV_PORT" "$word") || { note "device -> $REV_NET1:$REV_PORT/udp: $out"; return 1; }
  note "device $DEVICE_IP -> $REV_NET1:$REV_PORT/udp, answer: $out"
  note "collector's UDP log: $(grep -F "$word" "$COLL_UDP_LOG" || true)"
  from_pod "$out" "$word" "$REV_POD_IP" && grep -qF "[$word] from $REV_POD_IP:" "$COLL_UDP_LOG"
}
# Refused from the device: a port nothing declares on net1 (9001), a
# forward's port (8080: its listener is on every address of the pod, but
# what arrives on net1 is not relayed), and the reverse port from a source
# outside its allowedSources (a second address on the device, $FOREIGN_IP, for the
# time of the check). None may reach the collector or the device's echo.
c10d_refused() {
  local out ok=0 r0 r1 a0 a1 word=foreign-$RANDOM
  if out=$(dev_call tcp "$REV_NET1" 9001 undeclared); then ok=1; fi
  note "device -> $REV_NET1:9001/tcp (not declared): $out"
  a0=$(rev_field "$REV_POD" api refused)
  if out=$(dev_call tcp "$REV_NET1" 8080 forward-port); then ok=1; fi
  until_ok 10 differs "$a0" rev_field "$REV_POD" api refused || ok=1
  a1=$(rev_field "$REV_POD" api refused)
  note "device -> $REV_NET1:8080/tcp (forward api, arriving on net1): $out; api refused $a0 -> $a1"
  r0=$(rev_field "$REV_POD" collector refused)
  ip -n "$DEVICE_NS" addr add "$FOREIGN_IP/24" dev eth0
  if out=$(dev_call tcp "$REV_NET1" "$REV_PORT" "$word" "$FOREIGN_IP"); then ok=1; fi
  until_ok 10 differs "$r0" rev_field "$REV_POD" collector refused || ok=1
  r1=$(rev_field "$REV_POD" collector refused)
  ip -n "$DEVICE_NS" addr del "$FOREIGN_IP/24" dev eth0
  note "device $FOREIGN_IP -> $REV_NET1:$REV_PORT/tcp (allowedSources 172.17.16.120/32): $out; collector refused $r0 -> $r1"
  grep_logs "$word" && { note "the collector got it"; ok=1; }
  ((ok == 0))
}
REV_HOW="with the collector's DNS name as target (as shipped)"
[[ $KUBE == 1.20 ]] && REV_HOW="with its ClusterIP as target"
check "10a reverse: collector Service on $CLIENT_NODE, NAD from cni-conf/nad-reverse.yaml $REV_HOW, proxy pod $REV_POD; edgelinkd status lists collector/tcp and collector-udp/udp (reverse) listening on net1 only" c10a_setup
check "10b reverse TCP: device -> proxy pod net1:$REV_PORT -> Service ClusterIP -> collector pod; the collector sees the proxy pod's eth0, not the device" c10b_tcp
check "10c reverse UDP: device -> net1:$REV_PORT/udp -> Service -> collector and back; peer is the proxy pod's eth0" c10c_udp
check "10d refused from the device: an undeclared port, a forward's port on net1, a source outside allowedSources (counted, nothing reaches the collector)" c10d_refused
