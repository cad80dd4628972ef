#!/usr/bin/env bash
# The cross-node checks on the current profile's lab (KUBE=1.36, issue 23):
# up, the checks, down (KEEP=1: stays up). One PASS/FAIL line per check,
# then "N passed, M failed". The checks of the 1.20 lab (scripts/kube-lab/
# e2e.sh) are not ported yet.
#
#   KUBE=1.36 scripts/kube-lab/current/e2e.sh      (make image-offline first)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
KL=$(cd "$HERE/.." && pwd)
REPO=$(cd "$KL/../.." && pwd)
export KUBE=${KUBE:-1.36}
# shellcheck source=scripts/kube-lab/common.sh
. "$KL/common.sh"
# shellcheck source=scripts/kube-lab/current/topology.sh
. "$HERE/topology.sh"
# shellcheck source=scripts/kube-lab/current/node.sh
. "$HERE/node.sh"
[[ $(id -u) == 0 ]] || die "run as root"
[[ $KUBE != 1.20 ]] || die "current/e2e.sh is the KUBE=1.36 profile's"

KEEP=${KEEP:-}
ECHO=$REPO/scripts/lab/echo.py
DEV=device01-01
DEV_NS=$(device_ns "$DEV")
DEV_IP=$(device_ip "$DEV")
finish() {
  local p
  for p in tcp udp http; do
    [[ -n $(recorded_pid "$DEV-$p") ]] && kill "$(recorded_pid "$DEV-$p")" 2>/dev/null
  done
  if [[ -n $KEEP ]]; then log "KEEP=1: the lab stays up (KUBE=$KUBE scripts/kube-lab.sh down)"
  else "$REPO/scripts/kube-lab.sh" down || true; fi
}
trap finish EXIT
"$REPO/scripts/kube-lab.sh" up

kc() { in_node kcp "$BIN/kubectl" --kubeconfig "$RUN/kube/admin.kubeconfig" --request-timeout 30s "$@"; }
pass=0 fail=0
check() {
  local name=$1; shift
  if "$@"; then echo "PASS $name"; pass=$((pass + 1)); else echo "FAIL $name"; fail=$((fail + 1)); fi
}
note() { printf '     %s\n' "$*"; }
until_ok() {
  local t=$1 i; shift
  for ((i = 0; i < t * 2; i++)); do "$@" >/dev/null 2>&1 && return 0; sleep 0.5; done
  return 1
}

# The device: TCP echo 8080, UDP echo 5000, HTTP 80.
device() {
  setsid ip netns exec "$DEV_NS" python3 "$ECHO" "$2" "$DEV_IP" "$3" </dev/null >>"$RUN/logs/$DEV-$1.log" 2>&1 &
  record_pid "$DEV-$1" $!
}
device tcp serve 8080
device udp serve-udp 5000
device http serve-http 80

# The proxy pod on kedge1 (cni-conf as shipped), a client pod on kw1.
kc create namespace hil >/dev/null 2>&1 || true
for f in nad-forwards.yaml expose-a-device/statefulset.yaml expose-a-device/service.yaml; do
  kc apply -f - <"$REPO/cni-conf/$f" >/dev/null
done
kc -n hil apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: client}
spec:
  nodeName: kw1
  containers:
  - {name: c, image: $CLIENT_IMAGE, imagePullPolicy: Never, command: ["sleep", "3600"]}
YAML

x1_proxy() {
  until_ok 90 kc -n hil wait --for condition=Ready --timeout 2s pod/device01-01-0 pod/client || return 1
  local node status
  node=$(kc -n hil get pod device01-01-0 -o jsonpath='{.spec.nodeName}')
  status=$(kc -n hil get pod device01-01-0 -o jsonpath='{.metadata.annotations.k8s\.v1\.cni\.cncf\.io/network-status}' | tr -d ' \n')
  note "device01-01-0 on $node; client on $(kc -n hil get pod client -o jsonpath='{.spec.nodeName}')"
  [[ $node == kedge1 && $status == *'"interface":"net1","ips":["172.17.16.'* ]]
}
check "X1 the proxy pod runs on kedge1 with net1 (Multus thick, the plugin as its delegate), the client on kw1" x1_proxy
SVC=$(kc -n hil get svc device01-01 -o jsonpath='{.spec.clusterIP}')

x2_tcp() {
  local out l
  out=$(kc -n hil exec client -- sh -c "head -c 1048576 /dev/urandom >/tmp/mib && sha256sum </tmp/mib &&
    timeout 20 nc -w 5 $SVC 8080 </tmp/mib >/tmp/back; wc -c </tmp/back; sha256sum </tmp/back") || return 1
  mapfile -t l <<<"$out"
  note "sent ${l[0]%% *}, got ${l[1]} bytes ${l[2]%% *}"
  [[ ${l[1]} == 1048576 && ${l[0]%% *} == "${l[2]%% *}" ]]
}
check "X2 across nodes: TCP from kw1 through ClusterIP:8080 to the device behind kedge1: 1 MiB echoed, same SHA-256" x2_tcp

# in_client CMD...: CMD in the client pod's network namespace (the only
# pod namespace on kw1), from the node's mount namespace.
in_client() {
  local ns
  ns=$(in_node kw1 sh -c 'ls /run/netns | grep "^cni-" | head -n 1')
  [[ -n $ns ]] || return 1
  nsenter --mount="$(node_dir kw1)/ns/mnt" nsenter --net="/run/netns/$ns" "$@"
}
x3_udp() {
  local out
  out=$(in_client python3 "$ECHO" udp-ping "$SVC" 5000 5) || return 1
  note "echo.py udp-ping $SVC 5000 5 in the client's netns: $out"
  [[ $out == ok* ]]
}
check "X3 across nodes: UDP from kw1 through ClusterIP:5000: 5 datagrams echoed" x3_udp

x4_http() {
  local out
  out=$(kc -n hil exec client -- sh -c "printf 'GET / HTTP/1.0\r\nHost: device01-01\r\n\r\n' | timeout 10 nc -w 5 $SVC 80") || return 1
  note "$(echo "$out" | head -n 1 | tr -d '\r')"
  [[ $out == "HTTP/1.1 200"* && $out == *"device01-01: temperature="* ]]
}
check "X4 across nodes: HTTP through ClusterIP:80: 200 and the device's page" x4_http

proxy_gone() { ! kc -n hil get pod device01-01-0 >/dev/null 2>&1; }
x5_dns() {
  local out l
  out=$(kc -n hil exec client -- sh -c "head -c 65536 /dev/urandom >/tmp/k && sha256sum </tmp/k &&
    timeout 20 nc -w 5 device01-01.hil.svc.cluster.local 8080 </tmp/k >/tmp/kb; wc -c </tmp/kb; sha256sum </tmp/kb") || return 1
  mapfile -t l <<<"$out"
  note "by name device01-01.hil.svc.cluster.local: ${l[1]} bytes back, $([[ ${l[0]%% *} == "${l[2]%% *}" ]] && echo same || echo other) SHA-256"
  [[ ${l[1]} == 65536 && ${l[0]%% *} == "${l[2]%% *}" ]]
}
check "X5 across nodes by the Service's DNS name (CoreDNS from the Go module proxy): 64 KiB echoed, same SHA-256" x5_dns

x6_del() {
  local before after
  before=$(in_node kedge1 ls /var/lib/edgelink/attachments/ | wc -l)
  kc -n hil scale statefulset device01-01 --replicas 0 >/dev/null
  until_ok 60 proxy_gone || return 1
  after=$(in_node kedge1 ls /var/lib/edgelink/attachments/ | wc -l)
  note "records on kedge1: $before before, $after after; reservations: $(in_node kedge1 ls /var/lib/edgelink/ipam/plant-floor/ | grep -c '^172\.' || true)"
  [[ $before == 1 && $after == 0 ]] && ! in_node kedge1 ls /var/lib/edgelink/ipam/plant-floor/ | grep -q '^172\.'
}
check "X6 the proxy pod's deletion through Multus thick removes its record and its address's reservation" x6_del

echo "$pass passed, $fail failed"
((fail == 0))
