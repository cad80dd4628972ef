#!/usr/bin/env bash
# kmaster: kubeadm init (pod network 10.244.0.0/16, Flannel's), then Flannel
# as the cluster network and Multus (thin plugin) for second interfaces, both
# at pinned versions. The bootstrap token is the one the Vagrantfile passes to
# every node, so the nodes join without a shared folder. The vagrant user gets
# the admin kubeconfig (vagrant/e2e.sh runs kubectl here over ssh).
#
# Env: NODE_IP, POD_CIDR, KUBEADM_TOKEN, FLANNEL_VERSION (v0.26.1),
# FLANNEL_REACH (an address on the cluster net that no node holds),
# MULTUS_VERSION (v4.1.4). Runs as root after common.sh; safe to run again.
set -euo pipefail
: "${NODE_IP:?}" "${POD_CIDR:?}" "${KUBEADM_TOKEN:?}" "${FLANNEL_VERSION:?}" \
    "${FLANNEL_REACH:?}" "${MULTUS_VERSION:?}"
export KUBECONFIG=/etc/kubernetes/admin.conf
CACHE=/var/lib/edgelink-lab
install -d -m 0755 "$CACHE"

say() { echo "master: $*"; }
die() {
    echo "master: $*" >&2
    exit 1
}

# fetch URL FILE: download once (the versions are pinned, so is the content).
fetch() {
    [[ -s $2 ]] && return
    curl -fsSL --retry 5 -o "$2.part" "$1" || die "cannot download $1"
    mv "$2.part" "$2"
}

if [[ -f $KUBECONFIG ]]; then
    say "control plane already initialised"
else
    say "kubeadm init (advertise $NODE_IP, pod network $POD_CIDR)"
    kubeadm init --apiserver-advertise-address "$NODE_IP" \
        --pod-network-cidr "$POD_CIDR" --node-name "$(hostname)" \
        --token "$KUBEADM_TOKEN" --token-ttl 0
fi
# The token may have been deleted since; the joining nodes need it.
tokens=$(kubeadm token list | awk 'NR > 1 {print $1}')
if ! grep -qxF "$KUBEADM_TOKEN" <<<"$tokens"; then
    kubeadm token create "$KUBEADM_TOKEN" --ttl 0 >/dev/null
fi

if id vagrant >/dev/null 2>&1; then
    install -d -o vagrant -g vagrant -m 0700 /home/vagrant/.kube
    install -o vagrant -g vagrant -m 0600 "$KUBECONFIG" /home/vagrant/.kube/config
fi

say "Flannel $FLANNEL_VERSION (interface towards $FLANNEL_REACH)"
flannel=$CACHE/kube-flannel-$FLANNEL_VERSION.yml
fetch "https://github.com/flannel-io/flannel/releases/download/$FLANNEL_VERSION/kube-flannel.yml" "$flannel"
# Without --iface-can-reach flanneld takes the NIC of the default route: the
# management NIC, which has the same address on every VM under VirtualBox.
sed "s|^\([[:space:]]*\)- --kube-subnet-mgr\$|&\n\1- --iface-can-reach=$FLANNEL_REACH|" \
    "$flannel" > "$CACHE/kube-flannel.yml"
grep -qF -- "--iface-can-reach=$FLANNEL_REACH" "$CACHE/kube-flannel.yml" ||
    die "$flannel: no '- --kube-subnet-mgr' argument to add --iface-can-reach after"
grep -qF "\"Network\": \"$POD_CIDR\"" "$CACHE/kube-flannel.yml" ||
    die "$flannel: its net-conf.json network is not $POD_CIDR"
kubectl apply -f "$CACHE/kube-flannel.yml"
kubectl -n kube-flannel rollout status ds/kube-flannel-ds --timeout=10m

say "Multus $MULTUS_VERSION (thin plugin)"
multus=$CACHE/multus-daemonset-$MULTUS_VERSION.yml
fetch "https://raw.githubusercontent.com/k8snetworkplumbingwg/multus-cni/$MULTUS_VERSION/deployments/multus-daemonset.yml" "$multus"
# The release's manifest names the moving :snapshot image; pin it.
sed "s|\(ghcr.io/k8snetworkplumbingwg/multus-cni\):snapshot|\1:$MULTUS_VERSION|g" \
    "$multus" > "$CACHE/multus-daemonset.yml"
grep -qF "multus-cni:$MULTUS_VERSION" "$CACHE/multus-daemonset.yml" ||
    die "$multus: no multus-cni image to pin to $MULTUS_VERSION"
kubectl apply -f "$CACHE/multus-daemonset.yml"
kubectl wait --for condition=established --timeout=2m \
    crd/network-attachment-definitions.k8s.cni.cncf.io
say "done"
