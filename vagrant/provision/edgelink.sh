#!/usr/bin/env bash
# kedge1: edgelink from the local build. The image that `make image` built on
# the host, saved as an archive by vagrant/e2e.sh and uploaded by the
# Vagrantfile, goes into containerd's k8s.io namespace, under the reference
# the DaemonSet (daemonset/install.yaml) asks for, so the kubelet never pulls
# it. The DaemonSet itself is applied from kmaster (vagrant/e2e.sh).
#
# Env: IMAGE (fully qualified, e.g. docker.io/library/edgelink:0.1.0),
# IMAGE_TAR (the uploaded archive). Runs as root after common.sh; importing
# again replaces the image.
set -euo pipefail
: "${IMAGE:?}" "${IMAGE_TAR:?}"

say() { echo "edgelink: $*"; }
die() {
    echo "edgelink: $*" >&2
    exit 1
}

[[ -s $IMAGE_TAR ]] || die "$IMAGE_TAR is missing or empty"
say "importing $IMAGE_TAR ($(du -h "$IMAGE_TAR" | cut -f1)) into containerd (k8s.io)"
ctr -n k8s.io images import "$IMAGE_TAR"
refs=$(ctr -n k8s.io images ls -q)
grep -qxF "$IMAGE" <<<"$refs" ||
    die "the archive did not provide $IMAGE; containerd now has: $(grep -i edgelink <<<"$refs" | tr '\n' ' ')"
rm -f "$IMAGE_TAR"
say "$IMAGE is in containerd"
