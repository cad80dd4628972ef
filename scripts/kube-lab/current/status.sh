#!/usr/bin/env bash
# The current profile's (KUBE=1.36) state: cache, namespaces, each node's
# mount namespace and processes, the control plane, the devices' servers,
# each node's Ready and the lab's Multus mode. Changes nothing.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
KL=$(cd "$HERE/.." && pwd)
# shellcheck source=scripts/kube-lab/common.sh
. "$KL/common.sh"
# shellcheck source=scripts/kube-lab/current/topology.sh
. "$HERE/topology.sh"
# shellcheck source=scripts/kube-lab/current/node.sh
. "$HERE/node.sh"

row() { printf '%-28s %s\n' "$1" "$2"; }
stamp() { if [[ -f $2 ]]; then row "$1" "$(cat "$2")"; else row "$1" missing; fi; }
proc() {
  local p
  p=$(recorded_pid "$1")
  if [[ -n $p ]]; then row "$1" "running (pid $p)"
  elif [[ -f $RUN/pids/$1.pid ]]; then row "$1" "dead (log under $RUN)"
  else row "$1" "not started"; fi
}
stamp cache:kubernetes "$BIN/.stamp-k8s"
stamp cache:runtime "$BIN/.stamp-deps"
stamp cache:multus-thick "$MULTUS_DIR/.stamp-thick"
stamp cache:multus-thin "$MULTUS_DIR/.stamp"
stamp cache:coredns "$CACHE/coredns/.stamp"
stamp cache:crictl "$BIN/.stamp-crictl"
row multus "$(cat "$RUN/multus-mode" 2>/dev/null || echo "(lab not up)")"
for ns in "$SWITCH_NS" "$SEGMENT_NS"; do
  if has_ns "$ns"; then row "netns:$ns" present; else row "netns:$ns" absent; fi
done
for c in etcd kube-apiserver kube-controller-manager kube-scheduler; do proc "kcp-$c"; done
for n in "${NODES[@]}"; do
  if has_ns "$(node_ns "$n")"; then row "netns:$(node_ns "$n")" present; else row "netns:$(node_ns "$n")" absent; fi
  if [[ -f $(node_dir "$n")/ns/mnt ]] && mountpoint -q "$(node_dir "$n")/ns/mnt"; then row "$n:mountns" present
  else row "$n:mountns" absent; fi
  for c in containerd kubelet kube-proxy; do proc "$n-$c"; done
  if [[ -n $(recorded_pid "$n-containerd") ]]; then
    row "$n:pods (crictl)" "$("$BIN/crictl" --runtime-endpoint "unix://$(node_dir "$n")/containerd/containerd.sock" \
      --timeout 5s pods -q --state ready 2>/dev/null | grep -c . || true) ready sandboxes"
  fi
done
for d in "${DEVICES[@]}"; do
  for c in tcp udp http; do proc "$d-$c"; done
done
if [[ -n $(recorded_pid kcp-kube-apiserver) ]]; then
  for n in "${NODES[@]}"; do
    ready=$(in_node kcp "$BIN/kubectl" --kubeconfig "$RUN/kube/admin.kubeconfig" --request-timeout 5s \
      get node "$n" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null || echo unknown)
    row "node:$n" "Ready=${ready:-unknown}"
  done
fi
