#!/usr/bin/env bash
# A Kubernetes lab on this machine, inside namespaces of its own:
# docs/kube-lab.md. KUBE=1.36 (the default): four nodes
# (scripts/kube-lab/current/), Kubernetes v1.36 built from the Go module
# proxy, containerd 2, Multus thick (MULTUS=thin: thin), CoreDNS.
# KUBE=1.20 (the floor): one node, Kubernetes v1.20.2 from Debian's source
# package, Multus thin. `make e2e-kube [KUBE=1.20]` runs the checks.
#
#   scripts/kube-lab.sh build    build or reuse the cache under /var/tmp/edgelink-kube
#   scripts/kube-lab.sh up       build if needed, start the lab (idempotent)
#   scripts/kube-lab.sh down     stop what `up` started and remove its state
#   scripts/kube-lab.sh env      print `export KUBECONFIG=...` and the node namespace
#   scripts/kube-lab.sh status   the state of each component
#   scripts/kube-lab.sh cached   exit 0 if Kubernetes and Multus are built (make test's gate)
#   scripts/kube-lab.sh bindir   print the directory of the profile's kube binaries
#
# Multus is built from MULTUS_SRC (a source tree, or a git dir with tag
# v4.0.2) unless a build is cached.
set -euo pipefail
HERE=$(cd "$(dirname "$0")/kube-lab" && pwd)
# shellcheck source=scripts/kube-lab/common.sh
. "$HERE/common.sh"

cmd=${1:-}
case $cmd in
  build)
    t0=$SECONDS
    if [[ $KUBE == 1.20 ]]; then
      "$HERE/build-k8s.sh"
      "$HERE/build-deps.sh"
    else
      "$HERE/build-k8s-modproxy.sh"
      "$HERE/build-deps-current.sh"
      "$HERE/build-deps.sh" packages images
    fi
    log "build: $((SECONDS - t0)) s"
    ;;
  up) if [[ $KUBE == 1.20 ]]; then "$HERE/up.sh"; else "$HERE/current/up.sh"; fi ;;
  down) if [[ $KUBE == 1.20 ]]; then "$HERE/down.sh"; else "$HERE/current/down.sh"; fi ;;
  env)
    echo "export KUBECONFIG=$RUN/kube/admin.kubeconfig"
    echo "export PATH=$BIN:\$PATH"
    echo "export KUBE_LAB_NODE_NS=$NODE_NS"
    echo "export KUBE_LAB_MOUNT_NS=$RUN/ns/mnt"
    if [[ $KUBE == 1.20 ]]; then
      echo "export KUBE_LAB_CONTAINERD_SOCK=$RUN/containerd/containerd.sock"
    else
      echo "# a node's containers: crictl --runtime-endpoint unix://$RUN/nodes/kedge1/containerd/containerd.sock ps"
    fi
    echo "# the node's own view (/opt/cni/bin, /var/lib/kubelet, /run/netns): nsenter --mount=$RUN/ns/mnt --net=/run/netns/$NODE_NS sh"
    echo "# kubectl runs in the node namespace: ip netns exec $NODE_NS kubectl get nodes"
    ;;
  status) if [[ $KUBE == 1.20 ]]; then "$HERE/status.sh"; else "$HERE/current/status.sh"; fi ;;
  cached) cache_ready ;;
  bindir) echo "$BIN" ;;
  *)
    sed -n '2,16s/^# \{0,1\}//p' "$0" >&2
    exit 2
    ;;
esac
