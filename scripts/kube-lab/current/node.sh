# shellcheck shell=bash
# One node of the current profile's lab (sourced by up.sh, after common.sh
# and topology.sh): its private mount namespace, containerd 2, the kubelet
# and kube-proxy. Everything of node N lives under $RUN/nodes/N.

node_dir() { echo "$RUN/nodes/$1"; }

# node_mounts N: the node's private mount namespace, in which /opt,
# /etc/cni, /var/lib, /var/log and /run are directories of its own
# (/run/netns shared, for the pod namespaces; /opt shared, for the
# Bidirectional mount of /opt/cni/bin that Multus thick's init container
# copies its shim through; / shared here, for its hostroot mount, where the
# host's / is private). It follows the host's mounts (slave), and what is
# shared here is shared with the node's containers only: the host's mounts
# stay as they are.
node_mounts() {
  local d r
  d=$(node_dir "$1"); r=$d/roots
  mkdir -p "$r"/{opt/cni/bin,etc-cni/net.d,var-lib,var-log,run/netns} "$d"/{containerd,kube,logs}
  if ! mountpoint -q "$d/ns"; then
    mkdir -p "$d/ns"
    mount --bind "$d/ns" "$d/ns"
    mount --make-private "$d/ns"
  fi
  if ! [[ -f $d/ns/mnt ]] || ! mountpoint -q "$d/ns/mnt"; then
    touch "$d/ns/mnt"
    # shellcheck disable=SC2016  # expanded by the inner sh
    unshare --mount="$d/ns/mnt" --propagation slave sh -euc '
      # The host'"'"'s own /run/netns (ip netns) would stay under the node'"'"'s
      # /run, where an rbind of / (Multus thick'"'"'s hostroot) brings it back.
      umount -l /run/netns 2>/dev/null || true
      mount --bind "$1/opt" /opt
      mount --bind "$1/etc-cni" /etc/cni
      mount --bind "$1/var-lib" /var/lib
      mount --bind "$1/var-log" /var/log
      mount --bind "$1/run" /run
      mount --bind "$1/run/netns" /run/netns
      mount --make-shared /run/netns
      mount --make-shared /opt
      mount --make-shared /
    ' sh "$r"
  fi
}

# in_node N CMD...: run CMD in node N's network and mount namespaces.
in_node() {
  local n=$1; shift
  nsenter --mount="$(node_dir "$n")/ns/mnt" --net="/run/netns/$(node_ns "$n")" "$@"
}

# start_in N NAME CMD...: start CMD in node N unless its recorded NAME runs;
# its log is $RUN/nodes/N/logs/NAME.log.
start_in() {
  local n=$1 name=$2; shift 2
  if [[ -n $(recorded_pid "$n-$name") ]]; then log "$n/$name: running"; return 0; fi
  PATH=$BIN:$PATH setsid nsenter --mount="$(node_dir "$n")/ns/mnt" --net="/run/netns/$(node_ns "$n")" "$@" \
    </dev/null >>"$(node_dir "$n")/logs/$name.log" 2>&1 &
  record_pid "$n-$name" $!
  log "$n/$name: started (pid $!)"
}

# containerd 2 (config version 3) with runc, cgroupfs, the lab's images.
node_containerd() {
  local n=$1 c sock
  c=$(node_dir "$n")/containerd; sock=$c/containerd.sock
  cat >"$c/config.toml" <<TOML
version = 3
root = "$c/root"
state = "$c/state"
[grpc]
  address = "$sock"
[ttrpc]
  address = "$sock.ttrpc"
[plugins.'io.containerd.cri.v1.runtime']
  enable_selinux = false
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'runc'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = '$BIN/runc'
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ['/opt/cni/bin']
    conf_dir = '/etc/cni/net.d'
    max_conf_num = 1
[plugins.'io.containerd.cri.v1.images']
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = '$PAUSE_IMAGE'
TOML
  start_in "$n" containerd "$BIN/containerd" --config "$c/config.toml"
  wait_for "$n containerd" 30 "$BIN/ctr" --address "$sock" version
  local i
  for i in pause busybox; do
    "$BIN/ctr" --address "$sock" -n k8s.io images import "$IMG_DIR/$i.tar" >/dev/null
  done
}

# The kubelet: cgroupfs under a cgroup root of the node's own (four kubelets
# share this machine's cgroup v1 hierarchy), failCgroupV1 off (1.35+
# refuses v1 otherwise).
node_kubelet() {
  local n=$1 d labels
  d=$(node_dir "$n")
  cat >"$d/kube/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$P/ca.crt"}
authorization: {mode: Webhook}
containerRuntimeEndpoint: unix://$d/containerd/containerd.sock
cgroupDriver: cgroupfs
cgroupRoot: /$PREFIX-$n
failCgroupV1: false
failSwapOn: false
clusterDNS: [$DNS_SERVICE_IP]
clusterDomain: cluster.local
volumePluginDir: /var/lib/kubelet/volume-plugins
evictionHard: {memory.available: "100Mi", nodefs.available: "2%", imagefs.available: "2%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
# 500 proxy pods on one edge node (make bench-scale); a /22 podCIDR each.
maxPods: 600
YAML
  # The kubelet wants its cgroup root in every v1 hierarchy before it
  # starts; cpuset's needs its CPUs and memory nodes (a new v1 cpuset has
  # none). `down` removes them.
  local h root
  for h in /sys/fs/cgroup/*/; do
    [[ $h == */unified/ ]] && continue
    root=$h$PREFIX-$n
    mkdir -p "$root"
    if [[ $h == */cpuset/ ]]; then
      cat "${h}cpuset.cpus" >"$root/cpuset.cpus"
      cat "${h}cpuset.mems" >"$root/cpuset.mems"
    fi
  done
  labels=""
  is_edge "$n" && labels=edgelink.io/edge=true
  start_in "$n" kubelet "$BIN/kubelet" --config "$d/kube/kubelet.yaml" \
    --kubeconfig "$RUN/kube/kubelet-$n.kubeconfig" \
    --hostname-override "$n" --node-ip "$(node_ip "$n")" ${labels:+--node-labels "$labels"}
}

# kube-proxy in nftables mode (GA since 1.33, what current clusters run);
# conntrack sizes left alone (they are the machine's).
node_kube_proxy() {
  local n=$1
  start_in "$n" kube-proxy "$BIN/kube-proxy" --kubeconfig "$RUN/kube/kube-proxy.kubeconfig" \
    --hostname-override "$n" --bind-address 0.0.0.0 --cluster-cidr "$CLUSTER_CIDR" --proxy-mode nftables \
    --conntrack-max-per-core 0 --conntrack-tcp-timeout-established 0s --conntrack-tcp-timeout-close-wait 0s \
    --metrics-bind-address 127.0.0.1:10249 --healthz-bind-address 127.0.0.1:10256
}

# node_cni N CIDR: the pod network's conflist (bridge + host-local on the
# node's podCIDR) and the reference plugins in the node's /opt/cni/bin.
node_cni() {
  local n=$1 cidr=$2 r
  r=$(node_dir "$n")/roots
  # Each plugin put in place by rename: on a node started again (F4), a
  # plugin that is running (a DEL of a pod the restart reaps) would make
  # cp fail with "Text file busy".
  local f
  for f in "$CACHE/cni-bin/"*; do
    cp -a "$f" "$r/opt/cni/bin/.$(basename "$f").new" &&
      mv -f "$r/opt/cni/bin/.$(basename "$f").new" "$r/opt/cni/bin/$(basename "$f")" || return 1
  done
  cat >"$r/etc-cni/net.d/10-pods.conflist" <<JSON
{
  "cniVersion": "1.0.0",
  "name": "lab-pods",
  "plugins": [
    {
      "type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
      "ipam": {"type": "host-local", "ranges": [[{"subnet": "$cidr"}]], "routes": [{"dst": "0.0.0.0/0"}]}
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
JSON
}
