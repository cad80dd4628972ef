# shellcheck shell=bash
# shellcheck disable=SC2034  # the variables are used by the scripts that source this
# Shared settings for scripts/kube-lab.sh and its helpers. Sourced, not run.

K8S_VERSION=v1.20.2
K8S_DEB_SRC_VERSION=1.20.5+really1.20.2-1.1+deb12u1
MULTUS_VERSION=v4.0.2

CACHE=${KUBE_LAB_CACHE:-/var/tmp/edgelink-kube}
RUN=${KUBE_LAB_RUN:-$CACHE/run}          # lab state: removed by `down`
BIN=$CACHE/bin                           # kube binaries, etcd, etcdctl
MULTUS_DIR=$CACHE/multus
IMG_DIR=$CACHE/images

NODE=kedge1
NODE_NS=kedge1-node
PEER_NS=kedge1-uplink
DEVICE_NS=device01-01
NODE_IP=10.250.0.2
PEER_IP=10.250.0.1
DEVICE_IP=172.17.16.120
DEVICE_NODE_IP=172.17.16.1
POD_CIDR=10.88.0.0/16
SERVICE_CIDR=10.0.0.0/24
API_SERVICE_IP=10.0.0.1

log() { printf '[kube-lab] %s\n' "$*" >&2; }
die() { printf '[kube-lab] error: %s\n' "$*" >&2; exit 1; }

# A stamp file says a cached artefact was built for a given key.
stamp_ok() { [[ -f $1 && $(cat "$1") == "$2" ]]; }
stamp_set() { printf '%s\n' "$2" >"$1"; }

PAUSE_IMAGE=localhost/kube-lab/pause:busybox
CLIENT_IMAGE=localhost/kube-lab/busybox:1
ROOTS=$RUN/roots                         # the lab mount namespace's /opt, /etc/cni, /var/lib, /var/log, /run

# A recorded process: $RUN/pids/NAME.pid holds "PID STARTTIME" (field 22 of
# /proc/PID/stat), so a PID reused by another process is not taken for it.
record_pid() {
  local st
  st=$(awk '{print $22}' "/proc/$2/stat" 2>/dev/null || echo 0)
  printf '%s %s\n' "$2" "$st" >"$RUN/pids/$1.pid"
}
# recorded_pid NAME: print the PID if that process still runs
recorded_pid() {
  local f=$RUN/pids/$1.pid pid st
  [[ -f $f ]] || return 0
  read -r pid st <"$f" || return 0
  [[ $pid =~ ^[0-9]+$ ]] || return 0
  if [[ -n ${st:-} && $(awk '{print $22}' "/proc/$pid/stat" 2>/dev/null) == "$st" ]]; then echo "$pid"; fi
  return 0
}
