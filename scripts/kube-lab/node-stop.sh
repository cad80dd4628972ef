#!/usr/bin/env bash
# Half of a node "reboot" for the e2e checks: stop the kubelet, containerd,
# its shims and the containers, and remove the pods' network namespaces
# (unmounted without a CNI DEL, as a reboot would), leaving the control plane,
# the namespaces and the CNI state (/var/lib/cni, /var/lib/edgelink) alone.
# `scripts/kube-lab.sh up` then starts containerd and the kubelet again.
#
#   scripts/kube-lab/node-stop.sh                 the 1.20 lab's node
#   KUBE=1.36 scripts/kube-lab/node-stop.sh NODE  one node of the current lab
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/kube-lab/common.sh
. "$HERE/common.sh"
[[ $(id -u) == 0 ]] || die "run as root"
if [[ $KUBE == 1.20 ]]; then
  MNT=$RUN/ns/mnt
  pid_of() { recorded_pid "$1"; }
else
  # shellcheck source=scripts/kube-lab/current/topology.sh
  . "$HERE/current/topology.sh"
  # shellcheck source=scripts/kube-lab/current/node.sh
  . "$HERE/current/node.sh"
  N=${1:?which node: KUBE=$KUBE node-stop.sh NODE}
  MNT=$(node_dir "$N")/ns/mnt
  pid_of() { recorded_pid "$N-$1"; }
fi
if ! [[ -f $MNT ]] || ! mountpoint -q "$MNT"; then die "the lab is not up"; fi
ns=$(stat -L -c %i "$MNT")
# containerd's shims: in the lab's mount namespace, not recorded by `up`
mapfile -t shims < <(for p in $(pgrep -f containerd-shim-runc-v2 || true); do
  [[ $(stat -L -c %i "/proc/$p/ns/mnt" 2>/dev/null) == "$ns" ]] && echo "$p"; done)
# the containers: every process below a shim
mapfile -t ctrs < <(((${#shims[@]})) && ps -e -o pid=,ppid= | awk -v s="${shims[*]}" '
  BEGIN { n = split(s, a, " "); for (i = 1; i <= n; i++) top[a[i]] = 1 }
  { par[$1] = $2 }
  END { do { g = 0; for (p in par) if (!(p in keep) && ((par[p] in top) || (par[p] in keep))) { keep[p] = 1; g = 1 } } while (g)
        for (p in keep) print p }')
mapfile -t node < <(pid_of kubelet; pid_of containerd)
all=("${node[@]}" "${shims[@]}" "${ctrs[@]}")
log "killing kubelet+containerd (${#node[@]}), ${#shims[@]} shims, ${#ctrs[@]} container processes"
if ((${#all[@]})); then kill -KILL "${all[@]}" 2>/dev/null || true; fi
for ((i = 0; i < 20; i++)); do
  left=0; for p in "${all[@]}"; do kill -0 "$p" 2>/dev/null && left=1; done
  ((left)) || break; sleep 0.5
done
# the pods' network namespaces (their interfaces go with them)
# shellcheck disable=SC2016  # expanded by the inner sh
nsenter --mount="$MNT" sh -c 'n=0; for f in /run/netns/cni-*; do [ -e "$f" ] || continue; umount "$f" 2>/dev/null; rm -f "$f"; n=$((n+1)); done; echo "$n"' |
  { read -r n; log "removed $n pod network namespaces"; }
