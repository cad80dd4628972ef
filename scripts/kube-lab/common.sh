# shellcheck shell=bash
# shellcheck disable=SC2034  # the variables are used by the scripts that source this
# Shared settings for scripts/kube-lab.sh and its helpers. Sourced, not run.

# KUBE picks the profile: 1.20, the floor (built from Debian's source
# package with Go 1.19, the lab of docs/kube-lab.md), or 1.36, the current
# one (built from the Go module proxy with Go >= 1.26, four nodes:
# current/). Each has a cache of its own.
KUBE=${KUBE:-1.36}
case $KUBE in
  1.20)
    K8S_VERSION=v1.20.2
    K8S_DEB_SRC_VERSION=1.20.5+really1.20.2-1.1+deb12u1
    DEFAULT_CACHE=/var/tmp/edgelink-kube
    # Debian's Go 1.19 (golang-1.19-go) builds it; on a machine whose
    # default Go is newer the profile uses that one by itself.
    [[ -x /usr/lib/go-1.19/bin/go ]] && PATH=/usr/lib/go-1.19/bin:$PATH
    ;;
  1.36)
    K8S_VERSION=v1.36.3
    STAGING_VERSION=v0.36.3  # k8s.io/api, client-go, ... published beside it
    K8S_GO=1.26.0            # the `go` line of its go.mod
    COREDNS_VERSION=v1.15.0
    CRICTL_VERSION=v1.36.0
    DEFAULT_CACHE=/var/tmp/edgelink-kube-1.36
    ;;
  *) printf '[kube-lab] error: KUBE=%s: the profiles are 1.20 and 1.36\n' "$KUBE" >&2; exit 2 ;;
esac
MULTUS_VERSION=v4.0.2
# MULTUS: thick (the default of Multus 4, 1.36 only) or thin.
if [[ $KUBE == 1.20 ]]; then
  [[ ${MULTUS:-thin} == thin ]] || { printf '[kube-lab] error: the 1.20 profile runs Multus thin only\n' >&2; exit 2; }
  MULTUS=thin
else
  MULTUS=${MULTUS:-thick}
  [[ $MULTUS == thick || $MULTUS == thin ]] || { printf '[kube-lab] error: MULTUS=%s: thick or thin\n' "$MULTUS" >&2; exit 2; }
fi

CACHE=${KUBE_LAB_CACHE:-$DEFAULT_CACHE}
RUN=${KUBE_LAB_RUN:-$CACHE/run}          # lab state: removed by `down`
BIN=$CACHE/bin                           # kube binaries, etcd, etcdctl
MULTUS_DIR=$CACHE/multus
IMG_DIR=$CACHE/images

# The edge node and the device the checks of scripts/kube-lab/e2e.sh use:
# the 1.20 lab's only node; on 1.36, kedge1 of four (current/topology.sh).
NODE=kedge1
if [[ $KUBE == 1.20 ]]; then
  NODE_NS=kedge1-node
  DEVICE_NS=device01-01
else
  NODE_NS=k136-kedge1
  DEVICE_NS=k136-device01-01
fi
PEER_NS=kedge1-uplink
NODE_IP=10.250.0.2
PEER_IP=10.250.0.1
DEVICE_IP=172.17.16.120
DEVICE_NODE_IP=172.17.16.1
POD_CIDR=10.88.0.0/16
SERVICE_CIDR=10.0.0.0/24
API_SERVICE_IP=10.0.0.1

log() { printf '[kube-lab] %s\n' "$*" >&2; }
die() { printf '[kube-lab] error: %s\n' "$*" >&2; exit 1; }

# wait_for WHAT SECONDS CMD...
wait_for() {
  local what=$1 t=$2 i; shift 2
  for ((i = 0; i < t * 2; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  die "$what not ready after ${t}s (logs under $RUN)"
}

# A stamp file says a cached artefact was built for a given key.
stamp_ok() { [[ -f $1 && $(cat "$1") == "$2" ]]; }
stamp_set() { printf '%s\n' "$2" >"$1"; }
# The keys of the two slow builds: a change of version or of Go rebuilds.
k8s_key() {
  if [[ $KUBE == 1.20 ]]; then
    echo "k8s $K8S_VERSION deb $K8S_DEB_SRC_VERSION $(go version 2>/dev/null || echo nogo)"
  else
    echo "k8s $K8S_VERSION modproxy $STAGING_VERSION $(go version 2>/dev/null || echo nogo)"
  fi
}
# The Kubernetes commands a profile builds into $BIN.
K8S_COMPONENTS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
# k8s_build_begin: for build-k8s.sh and build-k8s-modproxy.sh: one build at
# a time (a second caller waits for the first, fd 9 holds the lock until
# the script ends); exit 0 when the cache holds every command with the
# stamp of k8s_key.
k8s_build_begin() {
  mkdir -p "$CACHE"
  exec 9>"$CACHE/.build-k8s.lock"
  flock 9
  stamp_ok "$BIN/.stamp-k8s" "$(k8s_key)" || return 0
  local c
  for c in "${K8S_COMPONENTS[@]}"; do [[ -x $BIN/$c ]] || return 0; done
  log "kubernetes $K8S_VERSION: cached in $BIN"
  exit 0
}
# The Go a profile built from the module proxy needs at least.
go_wanted() { echo "${K8S_GO:?only the module-proxy profiles name a Go}"; }
multus_key() { echo "multus $MULTUS_VERSION $(go version 2>/dev/null || echo nogo)"; }
# cache_ready: whether Kubernetes and Multus are built (the rest `up` makes
# in seconds); says what is missing on stderr otherwise.
cache_ready() {
  local missing=()
  if [[ $KUBE == 1.20 ]]; then
    stamp_ok "$BIN/.stamp-k8s" "$(k8s_key)" || missing+=("Kubernetes $K8S_VERSION (scripts/kube-lab.sh build, ~8 min)")
    { stamp_ok "$MULTUS_DIR/.stamp" "$(multus_key)" && [[ -x $MULTUS_DIR/multus ]]; } ||
      missing+=("Multus $MULTUS_VERSION (needs its source: MULTUS_SRC=... scripts/kube-lab.sh build)")
  else
    # What takes minutes to build; containerd, etcd and the images `up`
    # unpacks or builds in seconds.
    stamp_ok "$BIN/.stamp-k8s" "$(k8s_key)" ||
      missing+=("Kubernetes $K8S_VERSION (KUBE=$KUBE scripts/kube-lab.sh build, ~9 min with the Go module proxy)")
    [[ -x $MULTUS_DIR/multus-daemon && -x $MULTUS_DIR/multus ]] ||
      missing+=("Multus $MULTUS_VERSION (needs its source: MULTUS_SRC=... KUBE=$KUBE scripts/kube-lab.sh build)")
  fi
  if ((${#missing[@]})); then
    local IFS=';'
    printf 'no cached %s under %s\n' "${missing[*]}" "$CACHE" >&2
    return 1
  fi
}

PAUSE_IMAGE=localhost/kube-lab/pause:busybox
CLIENT_IMAGE=localhost/kube-lab/busybox:1
MULTUS_THICK_IMAGE=localhost/kube-lab/multus-thick:$MULTUS_VERSION
COREDNS_IMAGE=localhost/kube-lab/coredns:${COREDNS_VERSION:-none}
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

# stop_pids PID...: TERM, up to 10 s, then KILL.
stop_pids() {
  (($#)) || return 0
  local p i alive stubborn=()
  kill -TERM "$@" 2>/dev/null || true
  for ((i = 0; i < 20; i++)); do
    alive=0
    for p in "$@"; do kill -0 "$p" 2>/dev/null && alive=1; done
    ((alive)) || return 0
    sleep 0.5
  done
  for p in "$@"; do kill -0 "$p" 2>/dev/null && stubborn+=("$p"); done
  if ((${#stubborn[@]})); then
    log "killing ${#stubborn[@]} that did not stop in 10 s"
    kill -KILL "${stubborn[@]}" 2>/dev/null || true
    sleep 1
  fi
}

# with_descendants PID...: those processes and all their descendants (from
# the parent links of every process), not this shell.
with_descendants() {
  (($#)) || return 0
  ps -e -o pid=,ppid= | awk -v s="$*" '
    BEGIN { n = split(s, a, " "); for (i = 1; i <= n; i++) keep[a[i]] = 1 }
    { par[$1] = $2 }
    END {
      do { grew = 0; for (p in par) if (!(p in keep) && (par[p] in keep)) { keep[p] = 1; grew = 1 } } while (grew)
      for (p in keep) print p
    }' | grep -vx "$$" || true
}

# in_mount_ns FILE: the processes whose mount namespace is FILE's (a bind
# mount of /proc/PID/ns/mnt).
in_mount_ns() {
  local ns f p
  [[ -f $1 ]] && mountpoint -q "$1" || return 0
  ns=$(stat -L -c %i "$1" 2>/dev/null) || return 0
  for f in /proc/[0-9]*/ns/mnt; do
    [[ $(stat -L -c %i "$f" 2>/dev/null) == "$ns" ]] || continue
    p=${f#/proc/}; echo "${p%%/*}"
  done
}

# The machine-wide sysctls a kubelet sets: save_sysctls records them once
# (in `up`), restore_sysctls puts them back (in `down`).
save_sysctls() {
  [[ -f $RUN/sysctl.saved ]] && return 0
  local k
  for k in vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes; do
    echo "$k=$(sysctl -n "$k")"
  done >"$RUN/sysctl.saved.tmp"
  mv "$RUN/sysctl.saved.tmp" "$RUN/sysctl.saved"
}
# raise_sysctl KEY VALUE: set a machine-wide sysctl for the lab, its value
# before recorded beside save_sysctls' (once) so that `down` restores it.
raise_sysctl() {
  [[ -f $RUN/sysctl.saved ]] || save_sysctls
  grep -q "^$1=" "$RUN/sysctl.saved" || echo "$1=$(sysctl -n "$1")" >>"$RUN/sysctl.saved"
  sysctl -q -w "$1=$2"
}
restore_sysctls() {
  [[ -f $RUN/sysctl.saved ]] || return 0
  local k v
  while IFS='=' read -r k v; do
    [[ $(sysctl -n "$k") == "$v" ]] || { sysctl -q -w "$k=$v" && log "restored $k=$v"; }
  done <"$RUN/sysctl.saved"
}

# remove_run: the lab's state directory, unless something is still mounted
# under it.
remove_run() {
  [[ -d $RUN ]] || return 0
  if grep -q " ${RUN}[/ ]" /proc/self/mounts; then
    die "something is still mounted under $RUN; not removing it"
  fi
  rm -rf "$RUN"
}
