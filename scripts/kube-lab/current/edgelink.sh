# shellcheck shell=bash
# edgelink on the current profile's lab (sourced by up.sh, after node.sh):
# the offline image (`make image-offline`) in every node's containerd, the
# pause image the manifests name, daemonset/install.yaml unchanged, the
# DaemonSet rolled out on both edge nodes, the plugin in their
# /opt/cni/bin answering VERSION.
edgelink_up() {
  local ver images n sock ref=docker.io/library/edgelink:$EDGELINK_VERSION
  local tar=$REPO/target/image/edgelink-$EDGELINK_VERSION.oci.tar
  if [[ ! -s $tar ]]; then
    log "edgelink: building the offline image (make image-offline)"
    make -C "$REPO" image-offline >"$RUN/logs/image-offline.log" 2>&1 ||
      die "make image-offline failed: $RUN/logs/image-offline.log"
  fi
  for n in "${NODES[@]}"; do
    sock=$(node_dir "$n")/containerd/containerd.sock
    "$BIN/ctr" --address "$sock" -n k8s.io images import "$tar" >/dev/null
    images=$("$BIN/ctr" --address "$sock" -n k8s.io images ls -q)
    grep -qx "$ref" <<<"$images" || die "$tar did not import as $ref on $n"
    grep -qx registry.k8s.io/pause:3.9 <<<"$images" ||
      "$BIN/ctr" --address "$sock" -n k8s.io images tag "$PAUSE_IMAGE" registry.k8s.io/pause:3.9 >/dev/null
  done
  kc apply -f "$REPO/daemonset/install.yaml" >/dev/null
  kc -n edgelink-system rollout status daemonset/edgelinkd --timeout 120s >/dev/null ||
    die "DaemonSet edgelinkd did not roll out: kubectl -n edgelink-system describe pods"
  for n in "${EDGE_NODES[@]}"; do
    ver=$(in_node "$n" env CNI_COMMAND=VERSION /opt/cni/bin/edgelink </dev/null) ||
      die "/opt/cni/bin/edgelink VERSION failed on $n"
    [[ $ver == *supportedVersions* ]] || die "/opt/cni/bin/edgelink VERSION on $n: $ver"
  done
  log "edgelink: DaemonSet rolled out on ${EDGE_NODES[*]}, the plugin answers VERSION there"
}
