# shellcheck shell=bash
# Multus on the current profile's lab (sourced by up.sh, after node.sh), in
# the mode MULTUS names (common.sh):
#
# - thick (the default, the default install of Multus 4): its image in
#   every node's containerd, its DaemonSet (the tree's own manifest, with
#   the lab's image, never pulled, and memory to start on), ready on every
#   node. The daemon writes 00-multus.conf from the pod network's conflist,
#   and runs the delegates inside its container (chrootDir /hostroot: the
#   node's / as the delegate's root).
# - thin (Multus 3's way, still shipped by v4): the `multus` binary in each
#   node's /opt/cni/bin, called by containerd itself, with a 00-multus.conf
#   and a kubeconfig of its own (user multus) on each node; the NAD CRD
#   and that user's permissions (scripts/kube-lab/multus-thin.sh, shared
#   with the 1.20 profile).

multus_up() {
  if [[ $MULTUS == thick ]]; then multus_thick_up; else multus_thin_up; fi
}

multus_ready() {
  [[ $(kc -n kube-system get ds kube-multus-ds -o jsonpath='{.status.numberReady}') == "${#NODES[@]}" ]]
}

multus_thick_up() {
  local n
  for n in "${NODES[@]}"; do
    "$BIN/ctr" --address "$(node_dir "$n")/containerd/containerd.sock" -n k8s.io \
      images import "$IMG_DIR/multus-thick.tar" >/dev/null
  done
  sed -e "s#image: ghcr.io/k8snetworkplumbingwg/multus-cni:snapshot-thick#image: $MULTUS_THICK_IMAGE\n          imagePullPolicy: Never#" \
    -e 's#memory: "50Mi"#memory: "300Mi"#' \
    "$MULTUS_DIR/multus-thick.yml" | kc apply -f - >/dev/null
  wait_for "NAD CRD established" 30 kc wait --for condition=established --timeout 5s \
    crd/network-attachment-definitions.k8s.cni.cncf.io
  wait_for "Multus thick on every node" 120 multus_ready
  for n in "${NODES[@]}"; do
    wait_for "$n's 00-multus.conf" 30 test -s "$(node_dir "$n")/roots/etc-cni/net.d/00-multus.conf"
  done
}

multus_thin_up() {
  local n
  multus_thin_api
  for n in "${NODES[@]}"; do multus_thin_node "$(node_dir "$n")/roots" 10-pods.conflist; done
}
