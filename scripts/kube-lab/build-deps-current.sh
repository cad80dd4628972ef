#!/usr/bin/env bash
# The current profile's (KUBE=1.36) runtime pieces, cached under $CACHE,
# never installed on the host:
#   containerd 2 and its runc shim, etcd 3.5, the CNI reference plugins:
#     Debian sid's packages, fetched with a private apt configuration (the
#     system's apt untouched) and unpacked with dpkg-deb -x; they need at
#     most GLIBC_2.34 and run on this Debian 12 (../shared/kube-lab.md);
#   runc: bookworm's 1.1.5 (sid's and trixie's need GLIBC_2.38);
#   crictl: built from the Go module proxy (sigs.k8s.io/cri-tools).
# Each piece is checked to run before it is stamped.
# Usage: build-deps-current.sh [debs|crictl]...   (default: all)
set -euo pipefail
# shellcheck source=scripts/kube-lab/common.sh
. "$(dirname "$0")/common.sh"

SID_PACKAGES=(containerd etcd-server etcd-client containernetworking-plugins)

# apt-get (or apt-cache: SID_TOOL) with a configuration of its own under
# $CACHE/apt-sid.
sid_apt() {
  local a=$CACHE/apt-sid
  mkdir -p "$a/lists/partial" "$a/cache/archives/partial" "$a/sources.list.d"
  printf 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian sid main\n' >"$a/sources.list"
  "${SID_TOOL:-apt-get}" -o "Dir::Etc::SourceList=$a/sources.list" -o "Dir::Etc::SourceParts=$a/sources.list.d" \
    -o "Dir::State::Lists=$a/lists" -o "Dir::Cache=$a/cache" -o "Dir::State::Status=/dev/null" \
    -o "APT::Architecture=amd64" -q "$@"
}

debs() {
  local key d v
  sid_apt update -qq
  key="sid"
  for p in "${SID_PACKAGES[@]}"; do
    v=$(SID_TOOL=apt-cache sid_apt policy "$p" 2>/dev/null | awk '/Candidate:/ {print $2; exit}')
    [[ -n $v && $v != "(none)" ]] || die "sid has no package $p"
    key+=" $p=$v"
  done
  key+=" runc=$(apt-cache policy runc | awk '/Candidate/ {print $2}')"
  if stamp_ok "$BIN/.stamp-deps" "$key" && [[ -x $BIN/containerd && -x $BIN/runc && -x $BIN/etcd && -x $CACHE/cni-bin/bridge ]]; then
    log "containerd, runc, etcd, CNI plugins: cached"; return 0
  fi
  d=$CACHE/debs
  rm -rf "$d"; mkdir -p "$d/x" "$BIN" "$CACHE/cni-bin"
  log "apt-get download (sid): ${SID_PACKAGES[*]}"
  (cd "$d" && sid_apt download "${SID_PACKAGES[@]}")
  log "apt-get download (bookworm): runc"
  (cd "$d" && apt-get download -q runc)
  local f; for f in "$d"/*.deb; do dpkg-deb -x "$f" "$d/x"; done
  cp "$d/x/usr/bin/containerd" "$d/x/usr/bin/containerd-shim-runc-v2" "$d/x/usr/bin/ctr" \
    "$d/x/usr/bin/etcd" "$d/x/usr/bin/etcdctl" "$BIN/"
  cp "$d/x/usr/sbin/runc" "$BIN/runc" 2>/dev/null || cp "$d/x/usr/bin/runc" "$BIN/runc"
  cp -a "$d/x/usr/lib/cni/." "$CACHE/cni-bin/"
  rm -rf "$d"
  # They must run here (a newer glibc would show at once).
  "$BIN/containerd" --version >/dev/null || die "containerd from sid does not run here"
  "$BIN/runc" --version >/dev/null || die "runc does not run here"
  "$BIN/etcd" --version >/dev/null || die "etcd from sid does not run here"
  CNI_COMMAND=VERSION "$CACHE/cni-bin/bridge" </dev/null >/dev/null || die "the CNI bridge plugin from sid does not run here"
  stamp_set "$BIN/.stamp-deps" "$key"
  log "$("$BIN/containerd" --version); $("$BIN/runc" --version | head -n1); $("$BIN/etcd" --version | head -n1)"
}

# crictl of the same minor as Kubernetes, from the Go module proxy (~2 min).
crictl() {
  local key
  key="crictl $CRICTL_VERSION $(go version)"
  if stamp_ok "$BIN/.stamp-crictl" "$key" && [[ -x $BIN/crictl ]]; then log "crictl: cached"; return 0; fi
  log "building crictl $CRICTL_VERSION from the Go module proxy"
  local t0=$SECONDS
  mkdir -p "$BIN"
  GOMODCACHE=$CACHE/gomod/pkg/mod GOCACHE=$CACHE/gocache CGO_ENABLED=0 GOBIN=$BIN GOFLAGS='' \
    go install -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION" \
    "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"
  "$BIN/crictl" --version | grep -q "$CRICTL_VERSION" || die "crictl does not say $CRICTL_VERSION"
  stamp_set "$BIN/.stamp-crictl" "$key"
  log "crictl: built in $((SECONDS - t0)) s"
}

[[ $KUBE != 1.20 ]] || die "build-deps-current.sh is the KUBE=1.36 profile's; KUBE=1.20 uses build-deps.sh"
parts=("$@")
((${#parts[@]})) || parts=(debs crictl)
for p in "${parts[@]}"; do
  case $p in
    debs) debs ;;
    crictl) crictl ;;
    *) die "unknown part $p" ;;
  esac
done
