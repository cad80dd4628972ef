#!/usr/bin/env bash
# Start the current profile's lab (KUBE=1.36, idempotent): four nodes in
# namespaces of their own (topology.sh), Kubernetes built from the Go module
# proxy, containerd 2, a pod network routed across the nodes, kube-proxy in
# nftables mode. Each phase prints its time.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
KL=$(cd "$HERE/.." && pwd)
REPO=$(cd "$KL/../.." && pwd)
# shellcheck source=scripts/kube-lab/common.sh
. "$KL/common.sh"
# shellcheck source=scripts/kube-lab/current/topology.sh
. "$HERE/topology.sh"
# shellcheck source=scripts/kube-lab/current/node.sh
. "$HERE/node.sh"
# shellcheck source=scripts/kube-lab/multus-thin.sh
. "$KL/multus-thin.sh"
# shellcheck source=scripts/kube-lab/current/multus.sh
. "$HERE/multus.sh"
# shellcheck source=scripts/kube-lab/current/edgelink.sh
. "$HERE/edgelink.sh"
# shellcheck source=scripts/kube-lab/current/dns.sh
. "$HERE/dns.sh"
EDGELINK_VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$REPO/Cargo.toml" | head -n 1)

[[ $(id -u) == 0 ]] || die "run as root"
[[ $KUBE != 1.20 ]] || die "current/up.sh is the KUBE=1.36 profile's"
T0=$SECONDS
phase() { log "$1 done at $((SECONDS - T0)) s"; }

# --- the cache ------------------------------------------------------------------------------------
"$KL/build-k8s-modproxy.sh"
"$KL/build-deps-current.sh" debs crictl
if [[ $MULTUS == thick ]]; then "$KL/build-deps.sh" images multus-thick coredns
else "$KL/build-deps.sh" images multus coredns; fi
phase cache
mkdir -p "$RUN"/{pids,logs,etcd,kube}
# One Multus mode per lab: a lab up in the other one goes down first.
if [[ -f $RUN/multus-mode && $(cat "$RUN/multus-mode") != "$MULTUS" ]]; then
  die "the lab is up with MULTUS=$(cat "$RUN/multus-mode"); KUBE=$KUBE scripts/kube-lab.sh down first"
fi
echo "$MULTUS" >"$RUN/multus-mode"

# --- the machines and cables ------------------------------------------------------------------------
topology_up
for n in "${NODES[@]}"; do node_mounts "$n"; done
devices_up
phase "namespaces, devices"

# Machine-wide sysctls the kubelet sets: recorded once, `down` restores them.
save_sysctls

# --- certificates and kubeconfigs ----------------------------------------------------------------------
# shellcheck source=scripts/kube-lab/pki.sh
. "$KL/pki.sh"
cert apiserver kube-apiserver "" \
  "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:kcp,DNS:localhost,IP:$API_SERVICE_IP,IP:$API_IP,IP:127.0.0.1"
cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters
cert admin kubernetes-admin system:masters
cert controller-manager system:kube-controller-manager
cert scheduler system:kube-scheduler
cert kube-proxy system:kube-proxy
cert multus multus
for n in "${NODES[@]}"; do
  cert "kubelet-$n" "system:node:$n" system:nodes
done
if [[ ! -f $P/sa.key ]]; then
  openssl genrsa -out "$P/sa.key" 2048 2>/dev/null
  openssl rsa -in "$P/sa.key" -pubout -out "$P/sa.pub" 2>/dev/null
fi
for n in admin controller-manager scheduler kube-proxy multus "${NODES[@]/#/kubelet-}"; do
  kubeconfig "$n" "https://$API_IP:6443"
done
KUBECONFIG=$RUN/kube/admin.kubeconfig
export KUBECONFIG
kc() { in_node kcp "$BIN/kubectl" --kubeconfig "$KUBECONFIG" "$@"; }
phase certificates

# --- the control plane, on kcp ---------------------------------------------------------------------------
start_in kcp etcd "$BIN/etcd" --name kcp --data-dir "$RUN/etcd" \
  --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
  --initial-cluster kcp=http://127.0.0.1:2380
wait_for etcd 30 in_node kcp "$BIN/etcdctl" --endpoints http://127.0.0.1:2379 endpoint health
start_in kcp kube-apiserver "$BIN/kube-apiserver" \
  --etcd-servers http://127.0.0.1:2379 --bind-address 0.0.0.0 --advertise-address "$API_IP" \
  --secure-port 6443 --service-cluster-ip-range "$SERVICE_CIDR" \
  --client-ca-file "$P/ca.crt" --tls-cert-file "$P/apiserver.crt" --tls-private-key-file "$P/apiserver.key" \
  --kubelet-client-certificate "$P/apiserver-kubelet-client.crt" --kubelet-client-key "$P/apiserver-kubelet-client.key" \
  --kubelet-preferred-address-types InternalIP \
  --service-account-key-file "$P/sa.pub" --service-account-signing-key-file "$P/sa.key" \
  --service-account-issuer https://kubernetes.default.svc.cluster.local \
  --authorization-mode Node,RBAC --allow-privileged=true --enable-admission-plugins NodeRestriction
wait_for kube-apiserver 120 kc get --raw /readyz
start_in kcp kube-controller-manager "$BIN/kube-controller-manager" \
  --kubeconfig "$RUN/kube/controller-manager.kubeconfig" \
  --authentication-kubeconfig "$RUN/kube/controller-manager.kubeconfig" \
  --authorization-kubeconfig "$RUN/kube/controller-manager.kubeconfig" \
  --service-account-private-key-file "$P/sa.key" --root-ca-file "$P/ca.crt" \
  --cluster-signing-cert-file "$P/ca.crt" --cluster-signing-key-file "$P/ca.key" \
  --allocate-node-cidrs --cluster-cidr "$CLUSTER_CIDR" --node-cidr-mask-size 22 \
  --service-cluster-ip-range "$SERVICE_CIDR" \
  --use-service-account-credentials --leader-elect=false --bind-address 127.0.0.1
start_in kcp kube-scheduler "$BIN/kube-scheduler" --kubeconfig "$RUN/kube/scheduler.kubeconfig" \
  --authentication-kubeconfig "$RUN/kube/scheduler.kubeconfig" \
  --authorization-kubeconfig "$RUN/kube/scheduler.kubeconfig" \
  --leader-elect=false --bind-address 127.0.0.1
phase "control plane"

# --- the nodes --------------------------------------------------------------------------------------------
for n in "${NODES[@]}"; do
  node_containerd "$n"
  node_kubelet "$n"
  node_kube_proxy "$n"
done
for n in "${NODES[@]}"; do
  wait_for "node $n registered" 90 kc get node "$n"
done
pod_cidr() { kc get node "$1" -o jsonpath='{.spec.podCIDR}' 2>/dev/null; }
has_cidr() { [[ -n $(pod_cidr "$1") ]]; }
for n in "${NODES[@]}"; do
  wait_for "node $n's podCIDR" 60 has_cidr "$n"
  node_cni "$n" "$(pod_cidr "$n")"
done
pod_routes
node_ready() { [[ $(kc get node "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}') == True ]]; }
for n in "${NODES[@]}"; do
  wait_for "node $n Ready" 120 node_ready "$n"
done
phase nodes

multus_up
phase "Multus $MULTUS"

dns_up
phase "cluster DNS"

# KEEP_EDGELINK=1 (a node started again after node-stop.sh, as a reboot
# would): the DaemonSet is left as it is when it exists, not re-applied
# (re-applying it after an upgrade through take-overs rolls it again).
if [[ -n ${KEEP_EDGELINK:-} ]] && kc -n edgelink-system get daemonset edgelinkd >/dev/null 2>&1; then
  log "edgelink: the DaemonSet is kept as it is (KEEP_EDGELINK)"
else
  edgelink_up
fi
phase edgelink

log "up in $((SECONDS - T0)) s"
kc get nodes -o wide >&2
