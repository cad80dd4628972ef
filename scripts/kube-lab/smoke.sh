#!/usr/bin/env bash
# A quick proof that a running lab works (not the e2e checks): node Ready, a
# busybox pod Running, a pod reaching a ClusterIP Service through kube-proxy,
# a pod with a Multus NAD annotation getting net1, the device answering from
# the node namespace. Prints one PASS/FAIL line each; exits non-zero on a FAIL.
# Leaves nothing behind (its namespace kube-lab-smoke is deleted).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/kube-lab/common.sh
. "$HERE/common.sh"
export KUBECONFIG=$RUN/kube/admin.kubeconfig
kc() { ip netns exec "$NODE_NS" "$BIN/kubectl" --request-timeout 20s "$@"; }
pass=0 fail=0
check() {
  local name=$1; shift
  if "$@"; then echo "PASS $name"; pass=$((pass + 1)); else echo "FAIL $name"; fail=$((fail + 1)); fi
}
NS=kube-lab-smoke
kc delete namespace "$NS" --ignore-not-found --wait=true >/dev/null
kc create namespace "$NS" >/dev/null
kc -n "$NS" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: web, labels: {app: web}}
spec:
  nodeSelector: {edgelink.io/edge: "true"}
  containers:
  - name: web
    image: $CLIENT_IMAGE
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", "trap 'exit 0' TERM; while :; do echo -e 'HTTP/1.0 200 OK\r\n\r\nhello from web' | nc -l -p 8080 >/dev/null; done & wait"]
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Pod
metadata: {name: client}
spec:
  containers:
  - {name: client, image: $CLIENT_IMAGE, imagePullPolicy: Never}
---
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata: {name: lab-bridge}
spec:
  config: '{"cniVersion": "0.3.1", "name": "lab-bridge", "type": "bridge", "bridge": "labbr1",
            "ipam": {"type": "host-local", "subnet": "192.168.77.0/24"}}'
---
apiVersion: v1
kind: Pod
metadata:
  name: attached
  annotations: {k8s.v1.cni.cncf.io/networks: lab-bridge}
spec:
  containers:
  - {name: attached, image: $CLIENT_IMAGE, imagePullPolicy: Never}
YAML

node_ready() { [[ $(kc get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}') == True ]]; }
check "node $NODE Ready" node_ready
check "node labelled edgelink.io/edge=true" \
  bash -c "[[ \$(ip netns exec $NODE_NS $BIN/kubectl get node $NODE -o jsonpath='{.metadata.labels.edgelink\\.io/edge}') == true ]]"
check "pods Running" kc -n "$NS" wait --for condition=Ready --timeout 90s pod/web pod/client pod/attached
ip=$(kc -n "$NS" get svc web -o jsonpath='{.spec.clusterIP}')
svc() {
  local out
  out=$(kc -n "$NS" exec client -- sh -c "echo -e 'GET / HTTP/1.0\r\n\r\n' | timeout 5 nc $ip 80" 2>&1) || true
  [[ $out == *"hello from web"* ]]
}
check "client reaches ClusterIP $ip:80 (kube-proxy)" svc
net1() { kc -n "$NS" exec attached -- ip -4 -o addr show net1 | grep -q '192\.168\.77\.'; }
check "Multus NAD annotation gives net1" net1
status() {
  kc -n "$NS" get pod attached -o jsonpath='{.metadata.annotations.k8s\.v1\.cni\.cncf\.io/network-status}' |
    grep -q '"interface": *"net1"'
}
check "network-status annotation lists net1" status
dev() { [[ $(ip netns exec "$NODE_NS" ip -br link show eth1) == eth1@* ]] &&
  ip netns exec "$DEVICE_NS" python3 "$HERE/../lab/echo.py" ping "$DEVICE_IP" 8080 3 >/dev/null &&
  ip netns exec "$DEVICE_NS" python3 "$HERE/../lab/echo.py" udp-ping "$DEVICE_IP" 5000 3 >/dev/null &&
  ip netns exec "$DEVICE_NS" python3 "$HERE/../lab/echo.py" http-get "$DEVICE_IP" 80 3 >/dev/null; }
check "device01-01 serves TCP/UDP/HTTP on $DEVICE_IP (from inside its namespace)" dev
kc -n "$NS" get pods -o wide
kc -n "$NS" exec attached -- ip -4 -o addr || true
kc delete namespace "$NS" --wait=false >/dev/null
echo "$pass passed, $fail failed"
((fail == 0))
