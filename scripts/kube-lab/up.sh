#!/usr/bin/env bash
# Start the lab (idempotent): see scripts/kube-lab.sh and docs/kube-lab.md.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
# shellcheck source=scripts/kube-lab/common.sh
. "$HERE/common.sh"
# shellcheck source=scripts/kube-lab/multus-thin.sh
. "$HERE/multus-thin.sh"

[[ $(id -u) == 0 ]] || die "run as root"
T0=$SECONDS

# --- 1. the cache ---------------------------------------------------------------------------
"$HERE/build-k8s.sh"
"$HERE/build-deps.sh" packages etcd images
"$HERE/build-deps.sh" multus || die "no Multus: set MULTUS_SRC (see docs/kube-lab.md); not starting the lab"
log "cache ready after $((SECONDS - T0)) s"

mkdir -p "$RUN"/{pids,logs,pki,etcd,containerd,kube} \
  "$ROOTS"/{opt/cni/bin,etc-cni/net.d/multus.d,var-lib,var-log,run/netns}

# --- 2. namespaces ----------------------------------------------------------------------------
# The node: eth0 to a dead-end uplink namespace (a non-loopback address and a
# default route that leads nowhere), eth1 cabled to the device. The veths are
# made inside the namespaces, never in the host's.
has_ns() { ip netns list | awk '{print $1}' | grep -qx "$1"; }
for ns in "$NODE_NS" "$PEER_NS" "$DEVICE_NS"; do
  has_ns "$ns" || { ip netns add "$ns"; echo "$ns" >>"$RUN/netns.created"; }
  ip -n "$ns" link set lo up
done
if ! ip -n "$NODE_NS" link show eth0 >/dev/null 2>&1; then
  ip -n "$NODE_NS" link add eth0 type veth peer name downlink netns "$PEER_NS"
  ip -n "$NODE_NS" addr add "$NODE_IP/24" dev eth0
  ip -n "$PEER_NS" addr add "$PEER_IP/24" dev downlink
  ip -n "$NODE_NS" link set eth0 up
  ip -n "$PEER_NS" link set downlink up
  ip -n "$NODE_NS" route add default via "$PEER_IP"
fi
if ! ip -n "$NODE_NS" link show eth1 >/dev/null 2>&1; then
  ip -n "$NODE_NS" link add eth1 type veth peer name eth0 netns "$DEVICE_NS"
  ip -n "$DEVICE_NS" addr add "$DEVICE_IP/24" dev eth0
  ip -n "$NODE_NS" link set eth1 up
  ip -n "$DEVICE_NS" link set eth0 up
fi

# --- 3. the lab's mount namespace --------------------------------------------------------------
# containerd, the kubelet and the control plane share one private mount
# namespace in which the node's usual paths are the lab's own directories:
#   /opt -> $ROOTS/opt (CNI bin dir /opt/cni/bin, as on real nodes)
#   /etc/cni -> $ROOTS/etc-cni, /var/lib -> $ROOTS/var-lib,
#   /var/log -> $ROOTS/var-log, /run -> $ROOTS/run (/run/netns shared)
# so hostPath volumes such as /opt/cni/bin and /var/lib/edgelink, pod network
# namespaces, kubelet volume mounts and shim sockets never touch the host.
# It propagates from the host (rslave), so the host's / stays as it is: a
# private / here as on the host.
if ! mountpoint -q "$RUN/ns"; then
  mkdir -p "$RUN/ns"
  mount --bind "$RUN/ns" "$RUN/ns"
  mount --make-private "$RUN/ns"
fi
if ! [[ -f $RUN/ns/mnt ]] || ! mountpoint -q "$RUN/ns/mnt"; then
  touch "$RUN/ns/mnt"
  # shellcheck disable=SC2016  # expanded by the inner sh
  unshare --mount="$RUN/ns/mnt" --propagation slave sh -euc '
    mount --bind "$1/opt" /opt
    mount --bind "$1/etc-cni" /etc/cni
    mount --bind "$1/var-lib" /var/lib
    mount --bind "$1/var-log" /var/log
    mount --bind "$1/run" /run
    mount --bind "$1/run/netns" /run/netns
    mount --make-shared /run/netns
  ' sh "$ROOTS"
fi
in_lab() { nsenter --mount="$RUN/ns/mnt" --net="/run/netns/$NODE_NS" "$@"; }

# start NAME CMD...: run CMD in the node's network and the lab's mount
# namespace unless NAME's recorded process is alive.
alive() { [[ -n $(recorded_pid "$1") ]]; }
start() {
  local name=$1; shift
  if alive "$name"; then log "$name: running (pid $(recorded_pid "$name"))"; return 0; fi
  setsid nsenter --mount="$RUN/ns/mnt" --net="/run/netns/$NODE_NS" "$@" \
    </dev/null >>"$RUN/logs/$name.log" 2>&1 &
  record_pid "$name" $!
  log "$name: started (pid $!)"
}

# --- 4. machine-wide sysctls the kubelet sets: record them once, `down` restores --------------
save_sysctls

# --- 5. certificates ------------------------------------------------------------------------------
# shellcheck source=scripts/kube-lab/pki.sh
. "$HERE/pki.sh"
cert apiserver kube-apiserver "" \
  "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:$NODE,DNS:localhost,IP:$API_SERVICE_IP,IP:$NODE_IP,IP:127.0.0.1"
cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters
cert admin kubernetes-admin system:masters
cert controller-manager system:kube-controller-manager
cert scheduler system:kube-scheduler
cert kubelet "system:node:$NODE" system:nodes
cert kube-proxy system:kube-proxy
cert multus multus
if [[ ! -f $P/sa.key ]]; then
  openssl genrsa -out "$P/sa.key" 2048 2>/dev/null
  openssl rsa -in "$P/sa.key" -pubout -out "$P/sa.pub" 2>/dev/null
fi
for n in admin controller-manager scheduler kubelet kube-proxy multus; do
  kubeconfig "$n" "https://$NODE_IP:6443"
done
KUBECONFIG=$RUN/kube/admin.kubeconfig
export KUBECONFIG
kc() { in_lab "$BIN/kubectl" --kubeconfig "$KUBECONFIG" "$@"; }

# --- 6. control plane -------------------------------------------------------------------------------
start etcd "$BIN/etcd" --name kedge1 --data-dir "$RUN/etcd" \
  --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
  --initial-cluster kedge1=http://127.0.0.1:2380
wait_for etcd 30 in_lab "$BIN/etcdctl" --endpoints http://127.0.0.1:2379 endpoint health

start kube-apiserver "$BIN/kube-apiserver" \
  --etcd-servers http://127.0.0.1:2379 --bind-address 0.0.0.0 --advertise-address "$NODE_IP" \
  --secure-port 6443 --insecure-port 0 --service-cluster-ip-range "$SERVICE_CIDR" \
  --client-ca-file "$P/ca.crt" --tls-cert-file "$P/apiserver.crt" --tls-private-key-file "$P/apiserver.key" \
  --kubelet-client-certificate "$P/apiserver-kubelet-client.crt" --kubelet-client-key "$P/apiserver-kubelet-client.key" \
  --kubelet-preferred-address-types InternalIP \
  --service-account-key-file "$P/sa.pub" --service-account-signing-key-file "$P/sa.key" \
  --service-account-issuer https://kubernetes.default.svc.cluster.local \
  --authorization-mode Node,RBAC --allow-privileged=true --enable-admission-plugins NodeRestriction
wait_for kube-apiserver 90 kc get --raw /readyz

start kube-controller-manager "$BIN/kube-controller-manager" \
  --kubeconfig "$RUN/kube/controller-manager.kubeconfig" \
  --authentication-kubeconfig "$RUN/kube/controller-manager.kubeconfig" \
  --authorization-kubeconfig "$RUN/kube/controller-manager.kubeconfig" \
  --service-account-private-key-file "$P/sa.key" --root-ca-file "$P/ca.crt" \
  --cluster-signing-cert-file "$P/ca.crt" --cluster-signing-key-file "$P/ca.key" \
  --use-service-account-credentials --leader-elect=false --port 0 --bind-address 127.0.0.1
start kube-scheduler "$BIN/kube-scheduler" --kubeconfig "$RUN/kube/scheduler.kubeconfig" \
  --authentication-kubeconfig "$RUN/kube/scheduler.kubeconfig" \
  --authorization-kubeconfig "$RUN/kube/scheduler.kubeconfig" \
  --leader-elect=false --port 0 --bind-address 127.0.0.1

# --- 7. CNI: the lab's /opt/cni/bin and /etc/cni/net.d ------------------------------------------------
CNIBIN=$ROOTS/opt/cni/bin
for f in /usr/lib/cni/*; do
  [[ -e $CNIBIN/$(basename "$f") ]] || cp "$f" "$CNIBIN/"
done
NETD=$ROOTS/etc-cni/net.d
cat >"$NETD/10-bridge.conflist" <<JSON
{
  "cniVersion": "1.0.0",
  "name": "lab-pods",
  "plugins": [
    {
      "type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
      "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}]}
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
JSON
multus_thin_node "$ROOTS" 10-bridge.conflist

# --- 8. containerd ------------------------------------------------------------------------------------
C=$RUN/containerd
SOCK=$C/containerd.sock
cat >"$C/config.toml" <<TOML
version = 2
root = "$C/root"
state = "$C/state"
[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$C/containerd.sock.ttrpc"
[debug]
  level = "info"
[plugins."io.containerd.internal.v1.opt"]
  path = "$C/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/opt/cni/bin"
    conf_dir = "/etc/cni/net.d"
    max_conf_num = 1
TOML
start containerd containerd --config "$C/config.toml"
wait_for containerd 30 ctr --address "$SOCK" version
for i in pause busybox; do
  ctr --address "$SOCK" -n k8s.io images import "$IMG_DIR/$i.tar" >/dev/null
done

# --- 9. kubelet and kube-proxy ---------------------------------------------------------------------
cat >"$RUN/kube/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$P/ca.crt"}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
failSwapOn: false
volumePluginDir: /var/lib/kubelet/volume-plugins
evictionHard: {memory.available: "100Mi", nodefs.available: "2%", imagefs.available: "2%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
YAML
start kubelet "$BIN/kubelet" --config "$RUN/kube/kubelet.yaml" \
  --kubeconfig "$RUN/kube/kubelet.kubeconfig" \
  --container-runtime remote --container-runtime-endpoint "unix://$SOCK" \
  --hostname-override "$NODE" --node-ip "$NODE_IP" --pod-infra-container-image "$PAUSE_IMAGE" \
  --node-labels edgelink.io/edge=true
start kube-proxy "$BIN/kube-proxy" --kubeconfig "$RUN/kube/kube-proxy.kubeconfig" \
  --hostname-override "$NODE" --bind-address 0.0.0.0 --cluster-cidr "$POD_CIDR" --proxy-mode iptables \
  --conntrack-max-per-core 0 --conntrack-tcp-timeout-established 0s --conntrack-tcp-timeout-close-wait 0s \
  --metrics-bind-address 127.0.0.1:10249 --healthz-bind-address 127.0.0.1:10256

wait_for "node $NODE registered" 60 kc get node "$NODE"
kc label node "$NODE" edgelink.io/edge=true --overwrite >/dev/null
node_ready() { [[ $(kc get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}') == True ]]; }
wait_for "node $NODE Ready" 90 node_ready

# --- 10. Multus: the NAD CRD and its permissions ---------------------------------------------------------
multus_thin_api

# --- 11. the device: TCP echo 8080, UDP echo 5000, HTTP 80 on $DEVICE_IP ---------------------------------
dev_start() {
  local name=$1; shift
  if alive "$name"; then return 0; fi
  setsid ip netns exec "$DEVICE_NS" python3 "$REPO/scripts/lab/echo.py" "$@" \
    </dev/null >>"$RUN/logs/$name.log" 2>&1 &
  record_pid "$name" $!
}
dev_start device-tcp serve "$DEVICE_IP" 8080
dev_start device-udp serve-udp "$DEVICE_IP" 5000
dev_start device-http serve-http "$DEVICE_IP" 80

# --- 12. edgelink: image import and install.yaml (the image helper's part) -------------------------------------
# The hook gets the lab's coordinates in its environment.
if [[ -x $HERE/edgelink.sh ]]; then
  KUBECONFIG=$KUBECONFIG KUBE_LAB_NODE_NS=$NODE_NS KUBE_LAB_MOUNT_NS=$RUN/ns/mnt \
    KUBE_LAB_CONTAINERD_SOCK=$SOCK KUBE_LAB_BIN=$BIN KUBE_LAB_RUN=$RUN "$HERE/edgelink.sh" install
else
  log "skipped edgelink install: no scripts/kube-lab/edgelink.sh"
fi

log "up in $((SECONDS - T0)) s; $(kc get node "$NODE" --no-headers)"
