#!/usr/bin/env bash
# Stop the lab: only what `up` started, found by recorded PID and by the lab's
# own mount namespace. Safe after a partial `up` and when run twice.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/kube-lab/common.sh
. "$HERE/common.sh"
[[ $(id -u) == 0 ]] || die "run as root"

# The processes to stop: every recorded PID, every process in the lab's mount
# namespace (containerd's shims included), and all their descendants
# (the containers).
lab_pids() {
  local seeds=() p f
  for f in "$RUN"/pids/*.pid; do
    [[ -f $f ]] || continue
    p=$(recorded_pid "$(basename "$f" .pid)")
    [[ -n $p ]] && seeds+=("$p")
  done
  mapfile -t -O "${#seeds[@]}" seeds < <(in_mount_ns "$RUN/ns/mnt")
  with_descendants "${seeds[@]}"
}

recorded() { recorded_pid "$1"; }

# The node and its containers first, then the control plane, then etcd (the
# apiserver does not stop promptly once etcd is gone).
mapfile -t cp < <(for c in kube-apiserver kube-controller-manager kube-scheduler etcd; do recorded "$c"; done)
mapfile -t pids < <(lab_pids | grep -vxF -f <(printf '%s\n' "${cp[@]}" 0) || true)
if ((${#pids[@]})); then
  log "stopping ${#pids[@]} processes: node, containers, device"
  stop_pids "${pids[@]}"
fi
mapfile -t pids < <(for c in kube-apiserver kube-controller-manager kube-scheduler; do recorded "$c"; done)
if ((${#pids[@]})); then log "stopping the control plane"; stop_pids "${pids[@]}"; fi
mapfile -t pids < <(recorded etcd)
if ((${#pids[@]})); then log "stopping etcd"; stop_pids "${pids[@]}"; fi
mapfile -t pids < <(lab_pids)
if ((${#pids[@]})); then log "stopping ${#pids[@]} left"; stop_pids "${pids[@]}"; fi

# The mount namespace: unmounting its handle frees it and everything mounted
# inside (pod netns, kubelet volumes, overlay rootfs).
if [[ -d $RUN/ns ]]; then
  mountpoint -q "$RUN/ns/mnt" 2>/dev/null && umount "$RUN/ns/mnt"
  mountpoint -q "$RUN/ns" && umount "$RUN/ns"
fi

# Namespaces this lab created.
if [[ -f $RUN/netns.created ]]; then
  while read -r ns; do
    [[ -n $ns ]] || continue
    if ip netns del "$ns" 2>/dev/null; then log "deleted netns $ns"; fi
  done <"$RUN/netns.created"
fi

# The kubelet's pod cgroups (cgroupfs driver: kubepods under each hierarchy).
if [[ -f $RUN/pids/kubelet.pid ]]; then
  for h in /sys/fs/cgroup/*/; do
    [[ -d ${h}kubepods ]] || continue
    for ((i = 0; i < 10; i++)); do
      find "${h}kubepods" -depth -type d -exec rmdir {} + 2>/dev/null || true
      [[ -d ${h}kubepods ]] || break
      sleep 0.5
    done
    [[ -d ${h}kubepods ]] && log "warning: ${h}kubepods still there"
  done
fi

# Machine-wide sysctls the kubelet changed.
restore_sysctls
remove_run
log "down"
