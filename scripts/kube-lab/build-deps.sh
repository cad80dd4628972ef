#!/usr/bin/env bash
# Everything but Kubernetes itself, cached under $CACHE:
#   etcd (Debian etcd-server/etcd-client, extracted, never installed as a service)
#   containerd, runc, containernetworking-plugins (Debian packages)
#   Multus thin v4.0.2 built from $MULTUS_SRC or a cached source/binary;
#   Multus thick (multus-thick: the daemon, the shim, their image)
#   CoreDNS (coredns: from the Go module proxy, and its image)
#   busybox-static images: the sandbox (pause) image and a client image
# Usage: build-deps.sh [etcd|packages|multus|multus-thick|coredns|images]...   (default: etcd, packages, multus, images)
set -euo pipefail
# shellcheck source=scripts/kube-lab/common.sh
. "$(dirname "$0")/common.sh"

etcd() {
  local key
  key="etcd $(apt-cache policy etcd-server | awk '/Candidate/ {print $2}')"
  if stamp_ok "$BIN/.stamp-etcd" "$key" && [[ -x $BIN/etcd && -x $BIN/etcdctl ]]; then
    log "etcd: cached"; return 0
  fi
  local d=$CACHE/etcd-deb
  rm -rf "$d"; mkdir -p "$d/x" "$BIN"
  (cd "$d" && apt-get download -q etcd-server etcd-client)
  local f; for f in "$d"/*.deb; do dpkg-deb -x "$f" "$d/x"; done
  cp "$d/x/usr/bin/etcd" "$d/x/usr/bin/etcdctl" "$BIN/"
  rm -rf "$d"
  stamp_set "$BIN/.stamp-etcd" "$key"
  log "etcd: $("$BIN/etcd" --version | head -n1)"
}

packages() {
  local missing=() p
  for p in containerd runc containernetworking-plugins busybox-static openssl iproute2 util-linux python3 iptables conntrack; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if ((${#missing[@]})); then
    log "apt-get install ${missing[*]}"
    # policy-rc.d keeps the package's own containerd service from starting.
    local prc=/usr/sbin/policy-rc.d made=0
    if [[ ! -e $prc ]]; then printf '#!/bin/sh\nexit 101\n' >"$prc"; chmod +x "$prc"; made=1; fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" || { ((made)) && rm -f "$prc"; exit 1; }
    ((made)) && rm -f "$prc"
    if command -v systemctl >/dev/null && systemctl is-active -q containerd 2>/dev/null; then
      log "stopping and masking the system containerd service the package started"
      systemctl stop containerd; systemctl mask containerd
    fi
  fi
  log "packages: containerd $(containerd --version | awk '{print $3}'), runc $(runc --version | awk 'NR==1 {print $3}')"
}

# multus_source: Multus's source tree (tag $MULTUS_VERSION, vendored) in
# $MULTUS_DIR/src: from $MULTUS_SRC (a tree, or a git dir with the tag),
# else what is there already, else the 1.20 profile's copy.
multus_source() {
  local out=$MULTUS_DIR floor=/var/tmp/edgelink-kube/multus/src
  local src=$out/src
  mkdir -p "$out"
  if [[ -z ${MULTUS_SRC:-} && ! -f $src/cmd/multus/main.go && -f $floor/cmd/multus/main.go && $floor != "$src" ]]; then
    log "multus: the source from the 1.20 profile's cache ($floor)"
    MULTUS_SRC=$floor
  fi
  if [[ -n ${MULTUS_SRC:-} ]]; then
    rm -rf "$src"; mkdir -p "$src"
    if [[ -f $MULTUS_SRC/cmd/multus/main.go ]]; then
      cp -a "$MULTUS_SRC/." "$src/"
    elif git --git-dir="$MULTUS_SRC" rev-parse -q --verify "$MULTUS_VERSION^{commit}" >/dev/null 2>&1; then
      # archive the tag: the repository's newest commit may have dropped vendor/
      git --git-dir="$MULTUS_SRC" archive "$MULTUS_VERSION" | tar -x -C "$src"
    else
      die "no Multus: MULTUS_SRC=$MULTUS_SRC is neither a source tree nor a git dir with tag $MULTUS_VERSION"
    fi
  elif [[ ! -f $src/cmd/multus/main.go ]]; then
    die "no Multus: no binary or source under $out and MULTUS_SRC is unset (a git dir with tag $MULTUS_VERSION of github.com/k8snetworkplumbingwg/multus-cni, or its source tree)"
  fi
  [[ -d $src/vendor ]] || die "no Multus: $src has no vendor/ (use the $MULTUS_VERSION tag)"
  command -v go >/dev/null || die "no Go: apt-get install golang-go"
}

# multus_build CMD OUT: one of Multus's commands, static, from its vendor/.
multus_build() {
  (cd "$MULTUS_DIR/src" && CGO_ENABLED=0 GO111MODULE=on GOPROXY=off GOFLAGS='' GOCACHE=$CACHE/gocache \
    go build -mod=vendor -ldflags "-s -w -X gopkg.in/k8snetworkplumbingwg/multus-cni.v4/pkg/multus.version=$MULTUS_VERSION" \
    -o "$2.tmp" "./cmd/$1")
  mv "$2.tmp" "$2"
}

multus() {
  local out=$MULTUS_DIR key
  key=$(multus_key)
  if stamp_ok "$out/.stamp" "$key" && [[ -x $out/multus && -s $out/nad-crd.yaml ]]; then
    log "multus: cached in $out"; return 0
  fi
  local src=$out/src
  multus_source
  log "building Multus thin $MULTUS_VERSION (~4 min on 2 cores)"
  local t0=$SECONDS
  multus_build multus "$out/multus"
  # The NetworkAttachmentDefinition CRD, from the same tree's thin deployment.
  local dep=$src/deployments/multus-daemonset.yml
  [[ -f $dep ]] || die "no $dep in the Multus source"
  awk 'BEGIN{RS="\n---\n"} /kind: CustomResourceDefinition/ {print; exit}' "$dep" >"$out/nad-crd.yaml"
  grep -q 'network-attachment-definitions.k8s.cni.cncf.io' "$out/nad-crd.yaml" || die "NAD CRD not found in $dep"
  stamp_set "$out/.stamp" "$key"
  log "multus: built in $((SECONDS - t0)) s"
}

# A docker-archive image from a directory: one layer, no base image.
# make_image ROOTFS_DIR TAG OUT.tar CMD_JSON
# Multus thick (the default install of Multus 4): multus-daemon, which runs
# the delegates inside its container, and multus-shim, the CNI binary the
# runtime calls; an image holding both (and busybox, for the init
# container's cp) and the thick DaemonSet of the same tree.
multus_thick() {
  local out=$MULTUS_DIR key
  key="thick $(multus_key) passwd var-run"
  if stamp_ok "$out/.stamp-thick" "$key" && [[ -s $IMG_DIR/multus-thick.tar && -s $out/multus-thick.yml ]]; then
    log "multus thick: cached"; return 0
  fi
  multus_source
  local t0=$SECONDS r=$out/thick-root a
  log "building Multus thick $MULTUS_VERSION (multus-daemon, multus-shim)"
  rm -rf "$r"; mkdir -p "$r/usr/src/multus-cni/bin" "$r/bin" "$IMG_DIR"
  multus_build multus-daemon "$r/usr/src/multus-cni/bin/multus-daemon"
  multus_build multus-shim "$r/usr/src/multus-cni/bin/multus-shim"
  cp /bin/busybox "$r/bin/busybox"
  for a in sh cp ls cat; do ln -sf busybox "$r/bin/$a"; done
  # multus-daemon v4.0.2 looks itself up (user.Current, /etc/passwd without
  # cgo) and dereferences nil when it finds nobody.
  mkdir -p "$r/etc" "$r/var" "$r/run"
  echo 'root:x:0:0:root:/root:/bin/sh' >"$r/etc/passwd"
  # It checks a pod's netns at the path the runtime gives, /var/run/netns/…,
  # in its own container, where the DaemonSet mounts /run/netns.
  ln -sfn /run "$r/var/run"
  echo 'root:x:0:' >"$r/etc/group"
  make_image "$r" "$MULTUS_THICK_IMAGE" "$IMG_DIR/multus-thick.tar" '["/usr/src/multus-cni/bin/multus-daemon"]'
  rm -rf "$r"
  cp "$out/src/deployments/multus-daemonset-thick.yml" "$out/multus-thick.yml"
  stamp_set "$out/.stamp-thick" "$key"
  log "multus thick: built in $((SECONDS - t0)) s"
}

# CoreDNS (KUBE=1.36 only): built from the Go module proxy (`go install`,
# no wrapper needed), in an image made from a directory.
coredns() {
  local out=$CACHE/coredns key t0=$SECONDS r
  key="coredns $COREDNS_VERSION $(go version 2>/dev/null || echo nogo)"
  if stamp_ok "$out/.stamp" "$key" && [[ -x $out/coredns && -s $IMG_DIR/coredns.tar ]]; then
    log "coredns: cached"; return 0
  fi
  mkdir -p "$out" "$IMG_DIR"
  log "building CoreDNS $COREDNS_VERSION from the Go module proxy (~3 min on 2 cores)"
  GOBIN=$out GOMODCACHE=$CACHE/gomod GOCACHE=$CACHE/gocache GOFLAGS=-modcacherw CGO_ENABLED=0 \
    go install -trimpath -ldflags "-s -w" "github.com/coredns/coredns@$COREDNS_VERSION"
  r=$out/root
  rm -rf "$r"; mkdir -p "$r/etc"
  cp "$out/coredns" "$r/coredns"
  echo 'root:x:0:0:root:/root:/sbin/nologin' >"$r/etc/passwd"
  make_image "$r" "$COREDNS_IMAGE" "$IMG_DIR/coredns.tar" '["/coredns"]'
  rm -rf "$r"
  stamp_set "$out/.stamp" "$key"
  log "coredns: built in $((SECONDS - t0)) s"
}

make_image() {
  local root=$1 tag=$2 out=$3 cmd=$4 w
  w=$(mktemp -d "$CACHE/img.XXXXXX")
  tar --numeric-owner --owner=0 --group=0 --sort=name --mtime=@0 -C "$root" -cf "$w/layer.tar" .
  local diff cfg cfgsum
  diff=$(sha256sum "$w/layer.tar" | cut -d' ' -f1)
  cfg=$(printf '{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/bin:/sbin:/usr/bin:/usr/sbin"],"Cmd":%s},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' "$cmd" "$diff")
  cfgsum=$(printf '%s' "$cfg" | sha256sum | cut -d' ' -f1)
  printf '%s' "$cfg" >"$w/$cfgsum.json"
  printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["layer.tar"]}]' "$cfgsum" "$tag" >"$w/manifest.json"
  tar -C "$w" -cf "$out.tmp" manifest.json "$cfgsum.json" layer.tar
  mv "$out.tmp" "$out"
  rm -rf "$w"
}

images() {
  local key
  key="busybox $(dpkg-query -W -f='${Version}' busybox-static) v2"
  if stamp_ok "$IMG_DIR/.stamp" "$key" && [[ -s $IMG_DIR/busybox.tar && -s $IMG_DIR/pause.tar ]]; then
    log "images: cached"; return 0
  fi
  mkdir -p "$IMG_DIR"
  local r=$IMG_DIR/rootfs a
  rm -rf "$r"; mkdir -p "$r/bin" "$r/tmp" "$r/etc" "$r/proc" "$r/sys" "$r/dev"
  cp /bin/busybox "$r/bin/busybox"
  for a in $("$r/bin/busybox" --list); do
    [[ $a == busybox ]] || ln -sf busybox "$r/bin/$a"
  done
  printf 'root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$r/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\n' >"$r/etc/group"
  # PID 1 ignores signals it has no handler for: trap TERM so pods stop at once.
  local sleeper='["/bin/sh","-c","trap \"exit 0\" TERM INT; while :; do sleep 3600 & wait; done"]'
  make_image "$r" "$PAUSE_IMAGE" "$IMG_DIR/pause.tar" "$sleeper"
  make_image "$r" "$CLIENT_IMAGE" "$IMG_DIR/busybox.tar" "$sleeper"
  rm -rf "$r"
  stamp_set "$IMG_DIR/.stamp" "$key"
  log "images: $PAUSE_IMAGE, $CLIENT_IMAGE"
}

mkdir -p "$CACHE"
steps=("$@"); ((${#steps[@]})) || steps=(packages etcd images multus)
for s in "${steps[@]}"; do
  case $s in
    etcd | packages | multus | images) "$s" ;;
    multus-thick) multus_thick ;;
    coredns) coredns ;;
    *) die "unknown step $s" ;;
  esac
done
