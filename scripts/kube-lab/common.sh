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
# The keys of the two slow builds: a change of version or of Go rebuilds.
k8s_key() { echo "k8s $K8S_VERSION deb $K8S_DEB_SRC_VERSION $(go version 2>/dev/null || echo nogo)"; }
multus_key() { echo "multus $MULTUS_VERSION $(go version 2>/dev/null || echo nogo)"; }
# cache_ready: whether Kubernetes and Multus are built (the rest `up` makes
# in seconds); says what is missing on stderr otherwise.
cache_ready() {
  local missing=()
  stamp_ok "$BIN/.stamp-k8s" "$(k8s_key)" || missing+=("Kubernetes $K8S_VERSION (scripts/kube-lab.sh build, ~8 min)")
  { stamp_ok "$MULTUS_DIR/.stamp" "$(multus_key)" && [[ -x $MULTUS_DIR/multus ]]; } ||
    missing+=("Multus $MULTUS_VERSION (needs its source: MULTUS_SRC=... scripts/kube-lab.sh build)")
  if ((${#missing[@]})); then
    local IFS=';'
    printf 'no cached %s under %s\n' "${missing[*]}" "$CACHE" >&2
    return 1
  fi
}

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
