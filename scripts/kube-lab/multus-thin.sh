# shellcheck shell=bash
# Multus thin, as both profiles run it (sourced after common.sh, in a
# script that defines `kc`): the runtime calls the `multus` binary from the
# node's /opt/cni/bin with a 00-multus.conf and a kubeconfig of its own
# (user multus).

# multus_thin_api: the NAD CRD and the permissions of the user multus.
multus_thin_api() {
  kc apply -f "$MULTUS_DIR/nad-crd.yaml" >/dev/null
  kc apply -f - >/dev/null <<'YAML'
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: kube-lab-multus}
rules:
- apiGroups: ["k8s.cni.cncf.io"]
  resources: ["*"]
  verbs: ["*"]
- apiGroups: [""]
  resources: ["pods", "pods/status"]
  verbs: ["get", "list", "watch", "update", "patch"]
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch", "update"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: kube-lab-multus}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: kube-lab-multus}
subjects:
- {kind: User, name: multus, apiGroup: rbac.authorization.k8s.io}
YAML
  wait_for "NAD CRD established" 30 kc wait --for condition=established --timeout 5s \
    crd/network-attachment-definitions.k8s.cni.cncf.io
}

# multus_thin_node ROOTS CONFLIST: into a node's roots (its opt/cni/bin and
# etc-cni/net.d on the host), the binary, the kubeconfig and a
# 00-multus.conf whose cluster network is CONFLIST (a file name in
# /etc/cni/net.d). Each written whole, then renamed.
multus_thin_node() {
  local r=$1 netd=$1/etc-cni/net.d
  if ! cmp -s "$MULTUS_DIR/multus" "$r/opt/cni/bin/multus"; then
    cp "$MULTUS_DIR/multus" "$r/opt/cni/bin/multus.tmp" && mv "$r/opt/cni/bin/multus.tmp" "$r/opt/cni/bin/multus"
  fi
  mkdir -p "$netd/multus.d"
  cp "$RUN/kube/multus.kubeconfig" "$netd/multus.d/multus.kubeconfig"
  cat >"$netd/00-multus.conf.tmp" <<JSON
{
  "cniVersion": "0.3.1",
  "name": "multus-cni-network",
  "type": "multus",
  "kubeconfig": "/etc/cni/net.d/multus.d/multus.kubeconfig",
  "clusterNetwork": "/etc/cni/net.d/$2",
  "confDir": "/etc/cni/net.d",
  "binDir": "/opt/cni/bin",
  "cniDir": "/var/lib/cni/multus",
  "logFile": "/var/log/multus.log",
  "logLevel": "verbose"
}
JSON
  mv "$netd/00-multus.conf.tmp" "$netd/00-multus.conf"
}
