#!/usr/bin/env bash
# The state of each lab component: cache, namespaces, processes, node.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/kube-lab/common.sh
. "$HERE/common.sh"

row() { printf '%-24s %s\n' "$1" "$2"; }
cached() { if [[ -f $2 ]]; then row "$1" "$(cat "$2")"; else row "$1" missing; fi; }
cached cache:kubernetes "$BIN/.stamp-k8s"
cached cache:etcd "$BIN/.stamp-etcd"
cached cache:multus "$MULTUS_DIR/.stamp"
cached cache:images "$IMG_DIR/.stamp"
for ns in "$NODE_NS" "$PEER_NS" "$DEVICE_NS"; do
  if ip netns list | awk '{print $1}' | grep -qx "$ns"; then row "netns:$ns" present; else row "netns:$ns" absent; fi
done
if [[ -f $RUN/ns/mnt ]] && mountpoint -q "$RUN/ns/mnt"; then row mountns present; else row mountns absent; fi
for c in etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet kube-proxy device-tcp device-udp device-http; do
  f=$RUN/pids/$c.pid p=$(recorded_pid "$c")
  if [[ -n $p ]]; then row "$c" "running (pid $p)"
  elif [[ -f $f ]]; then row "$c" "dead (log $RUN/logs/$c.log)"
  else row "$c" "not started"; fi
done
if [[ -n $(recorded_pid kube-apiserver) ]]; then
  ready=$(ip netns exec "$NODE_NS" "$BIN/kubectl" --kubeconfig "$RUN/kube/admin.kubeconfig" --request-timeout 5s \
    get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null || echo unknown)
  row "node:$NODE" "Ready=${ready:-unknown}"
fi
