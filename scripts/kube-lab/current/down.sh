#!/usr/bin/env bash
# Stop the current profile's lab: only what current/up.sh started (recorded
# PIDs, the processes of the nodes' mount namespaces and their
# descendants), the nodes' mount namespaces, the network namespaces it
# made, the kubelets' cgroups, the sysctls the kubelets set. Safe after a
# partial `up` and when run twice.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
KL=$(cd "$HERE/.." && pwd)
# shellcheck source=scripts/kube-lab/common.sh
. "$KL/common.sh"
# shellcheck source=scripts/kube-lab/current/topology.sh
. "$HERE/topology.sh"
# shellcheck source=scripts/kube-lab/current/node.sh
. "$HERE/node.sh"
[[ $(id -u) == 0 ]] || die "run as root"

# recorded NAME...: their PIDs, where they still run.
recorded() { local n; for n in "$@"; do recorded_pid "$n"; done; }
node_pids() {
  local n seeds=()
  for n in "${NODES[@]}"; do
    mapfile -t -O "${#seeds[@]}" seeds < <(recorded "$n-kubelet" "$n-kube-proxy" "$n-containerd"; in_mount_ns "$(node_dir "$n")/ns/mnt")
  done
  with_descendants "${seeds[@]}" | grep -vxF -f <(recorded kcp-kube-apiserver kcp-kube-controller-manager kcp-kube-scheduler kcp-etcd; echo 0) || true
}
mapfile -t pids < <(node_pids)
if ((${#pids[@]})); then log "stopping ${#pids[@]} processes: kubelets, kube-proxies, containerd, containers"; stop_pids "${pids[@]}"; fi
mapfile -t pids < <(recorded kcp-kube-apiserver kcp-kube-controller-manager kcp-kube-scheduler)
if ((${#pids[@]})); then log "stopping the control plane"; stop_pids "${pids[@]}"; fi
mapfile -t pids < <(recorded kcp-etcd)
if ((${#pids[@]})); then log "stopping etcd"; stop_pids "${pids[@]}"; fi
mapfile -t pids < <(node_pids)
if ((${#pids[@]})); then log "stopping ${#pids[@]} left"; stop_pids "${pids[@]}"; fi
# Containers whose shim went first are nobody's descendants any more, and
# have mount namespaces of their own: the nodes' cgroups still hold them.
cgroup_pids() {
  local n
  for n in "${NODES[@]}"; do
    [[ -d /sys/fs/cgroup/pids/$PREFIX-$n ]] || continue
    find "/sys/fs/cgroup/pids/$PREFIX-$n" -name cgroup.procs -exec cat {} + 2>/dev/null
  done
}
mapfile -t pids < <(cgroup_pids)
if ((${#pids[@]})); then log "stopping ${#pids[@]} containers left in the nodes' cgroups"; stop_pids "${pids[@]}"; fi

[[ -d $RUN/pids ]] && devices_down

for n in "${NODES[@]}"; do
  d=$(node_dir "$n")
  [[ -d $d/ns ]] || continue
  mountpoint -q "$d/ns/mnt" 2>/dev/null && umount "$d/ns/mnt"
  mountpoint -q "$d/ns" && umount "$d/ns"
done

if [[ -f $RUN/netns.created ]]; then
  while read -r ns; do
    [[ -n $ns ]] || continue
    if ip netns del "$ns" 2>/dev/null; then log "deleted netns $ns"; fi
  done <"$RUN/netns.created"
fi

# The kubelets' cgroups: each node's pods under /<prefix>-<node> in every
# hierarchy (cgroupfs driver, cgroupRoot).
for h in /sys/fs/cgroup/*/; do
  for n in "${NODES[@]}"; do
    root=$h$PREFIX-$n
    [[ -d $root ]] || continue
    for ((i = 0; i < 10; i++)); do
      find "$root" -depth -type d -exec rmdir {} + 2>/dev/null || true
      [[ -d $root ]] || break
      sleep 0.5
    done
    [[ -d $root ]] && log "warning: $root still there"
  done
done

restore_sysctls
remove_run
log "down"
