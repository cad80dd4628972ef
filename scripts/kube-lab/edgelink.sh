#!/usr/bin/env bash
# edgelink in the kube lab: the hook `scripts/kube-lab.sh up` runs last.
#
#   scripts/kube-lab/edgelink.sh install
#
# - builds the offline image if it is missing (`make image-offline`:
#   target/image/edgelink-<version>.oci.tar, docs/install.md);
# - imports it into the lab's containerd (k8s.io namespace), where it is
#   docker.io/library/edgelink:<version>, the image daemonset/install.yaml
#   names as edgelink:<version>;
# - tags the lab's busybox pause image as registry.k8s.io/pause:3.9, the
#   image cni-conf/expose-a-device/statefulset.yaml names (the lab has no
#   registry; the pod only holds a network namespace, which busybox's
#   sleeping shell does as well);
# - applies daemonset/install.yaml unchanged, waits for the DaemonSet's
#   rollout on kedge1, and checks that the plugin landed in the node's
#   /opt/cni/bin (in the lab's mount namespace) and answers VERSION.
#
# Environment (from `up`, or from `eval "$(scripts/kube-lab.sh env)"`):
# KUBECONFIG, KUBE_LAB_NODE_NS, KUBE_LAB_MOUNT_NS, KUBE_LAB_CONTAINERD_SOCK,
# KUBE_LAB_BIN, KUBE_LAB_RUN.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
# shellcheck source=scripts/kube-lab/common.sh
. "$HERE/common.sh"

: "${KUBECONFIG:=$RUN/kube/admin.kubeconfig}"
: "${KUBE_LAB_NODE_NS:=$NODE_NS}"
: "${KUBE_LAB_MOUNT_NS:=$RUN/ns/mnt}"
: "${KUBE_LAB_CONTAINERD_SOCK:=$RUN/containerd/containerd.sock}"
: "${KUBE_LAB_BIN:=$BIN}"
export KUBECONFIG

VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$REPO/Cargo.toml" | head -n 1)
IMAGE_TAR=$REPO/target/image/edgelink-$VERSION.oci.tar
IMAGE_REF=docker.io/library/edgelink:$VERSION
# The image names the manifests use that the lab makes from its own images.
STS_PAUSE_IMAGE=registry.k8s.io/pause:3.9

kc() { ip netns exec "$KUBE_LAB_NODE_NS" "$KUBE_LAB_BIN/kubectl" --request-timeout 30s "$@"; }
ctr_() { ctr -a "$KUBE_LAB_CONTAINERD_SOCK" -n k8s.io "$@"; }
# the node's own view: its /opt/cni/bin, /var/lib/edgelink, /run/netns
on_node() { nsenter --mount="$KUBE_LAB_MOUNT_NS" --net="/run/netns/$KUBE_LAB_NODE_NS" "$@"; }

install() {
  local t0=$SECONDS ver images
  if [[ ! -s $IMAGE_TAR ]]; then
    log "edgelink: building the offline image (make image-offline)"
    make -C "$REPO" image-offline >"$RUN/logs/image-offline.log" 2>&1 ||
      die "make image-offline failed: $RUN/logs/image-offline.log"
  fi
  ctr_ images import "$IMAGE_TAR" >/dev/null
  # (a variable, not a pipe into grep -q: with pipefail, ctr's SIGPIPE would fail it)
  images=$(ctr_ images ls -q)
  grep -qx "$IMAGE_REF" <<<"$images" || die "$IMAGE_TAR did not import as $IMAGE_REF"
  if ! grep -qx "$STS_PAUSE_IMAGE" <<<"$images"; then
    ctr_ images tag "$PAUSE_IMAGE" "$STS_PAUSE_IMAGE" >/dev/null
  fi
  log "edgelink: images $IMAGE_REF, $STS_PAUSE_IMAGE (= $PAUSE_IMAGE) in the lab's containerd"

  kc apply -f "$REPO/daemonset/install.yaml" >/dev/null
  kc -n edgelink-system rollout status daemonset/edgelinkd --timeout 120s >/dev/null ||
    die "DaemonSet edgelinkd did not roll out: kubectl -n edgelink-system describe pods"
  on_node test -x /opt/cni/bin/edgelink || die "no /opt/cni/bin/edgelink on $NODE"
  ver=$(on_node env CNI_COMMAND=VERSION /opt/cni/bin/edgelink </dev/null) ||
    die "/opt/cni/bin/edgelink VERSION failed"
  [[ $ver == *supportedVersions* ]] || die "/opt/cni/bin/edgelink VERSION: $ver"
  log "edgelink: DaemonSet rolled out on $NODE, /opt/cni/bin/edgelink answers VERSION ($((SECONDS - t0)) s)"
}

case ${1:-} in
  install) install ;;
  *)
    sed -n '2,21s/^# \{0,1\}//p' "$0" >&2
    exit 2
    ;;
esac
