# shellcheck shell=bash
# Cluster DNS on the current profile's lab (sourced by up.sh, after
# node.sh): CoreDNS built from the Go module proxy, as kube-dns at
# $DNS_SERVICE_IP (the kubelets' clusterDNS), serving cluster.local from the
# API (no upstream: the lab reaches nothing beyond its nodes).
dns_up() {
  local n
  for n in "${NODES[@]}"; do
    "$BIN/ctr" --address "$(node_dir "$n")/containerd/containerd.sock" -n k8s.io \
      images import "$IMG_DIR/coredns.tar" >/dev/null
  done
  kc apply -f - >/dev/null <<YAML
apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: kube-lab-coredns}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: kube-lab-coredns}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: kube-lab-coredns}
subjects:
- {kind: ServiceAccount, name: coredns, namespace: kube-system}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  Corefile: |
    .:53 {
        errors
        health :8080
        ready :8181
        kubernetes cluster.local in-addr.arpa ip6.arpa {
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
        }
        cache 30
        loop
        reload
    }
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: coredns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  replicas: 1
  selector: {matchLabels: {k8s-app: kube-dns}}
  template:
    metadata: {labels: {k8s-app: kube-dns}}
    spec:
      serviceAccountName: coredns
      nodeSelector: {kubernetes.io/hostname: kcp}
      dnsPolicy: Default
      containers:
      - name: coredns
        image: $COREDNS_IMAGE
        imagePullPolicy: Never
        command: [/coredns, -conf, /etc/coredns/Corefile]
        ports:
        - {containerPort: 53, name: dns, protocol: UDP}
        - {containerPort: 53, name: dns-tcp, protocol: TCP}
        readinessProbe: {httpGet: {path: /ready, port: 8181}}
        volumeMounts: [{name: config, mountPath: /etc/coredns}]
      volumes:
      - {name: config, configMap: {name: coredns}}
---
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  clusterIP: $DNS_SERVICE_IP
  selector: {k8s-app: kube-dns}
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
YAML
  kc -n kube-system rollout status deployment/coredns --timeout 120s >/dev/null ||
    die "CoreDNS did not become ready: kubectl -n kube-system describe pods -l k8s-app=kube-dns"
}
