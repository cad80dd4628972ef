#!/usr/bin/env bash
# Every Kubernetes node (kmaster, kworker1, kedge1): swap off, the kernel
# modules and sysctls Kubernetes needs, containerd (Debian's) with the systemd
# cgroup driver, and kubeadm, kubelet, kubectl from pkgs.k8s.io, held at the
# minor version K8S_VERSION. The kubelet registers NODE_IP (the cluster NIC,
# not the management NIC) and NODE_LABELS.
#
# Env (the Vagrantfile sets them): K8S_VERSION (1.31), NODE_IP,
# NODE_LABELS (may be empty), CLUSTER_HOSTS ("ip=name ...", for /etc/hosts).
# Runs as root; safe to run again (vagrant provision).
set -euo pipefail
: "${K8S_VERSION:?}" "${NODE_IP:?}" "${NODE_LABELS?}" "${CLUSTER_HOSTS:?}"
export DEBIAN_FRONTEND=noninteractive
APT=(apt-get -q -o Dpkg::Use-Pty=0 -o DPkg::Lock::Timeout=300)

say() { echo "common: $*"; }

# Writes stdin to $1 if the content differs; returns 0 when it changed.
write_if_changed() {
    local new
    new=$(mktemp)
    cat > "$new"
    if [[ -f $1 ]] && cmp -s "$new" "$1"; then
        rm -f "$new"
        return 1
    fi
    install -m 0644 "$new" "$1"
    rm -f "$new"
}

say "swap off"
swapoff -a
sed -ri '/^[^#].*[[:space:]]swap[[:space:]]/s/^/#/' /etc/fstab

say "kernel modules and sysctls"
printf 'overlay\nbr_netfilter\n' | write_if_changed /etc/modules-load.d/k8s.conf || true
modprobe overlay
modprobe br_netfilter
write_if_changed /etc/sysctl.d/90-k8s.conf <<'EOF' || true
net.bridge.bridge-nf-call-iptables = 1
net.bridge.bridge-nf-call-ip6tables = 1
net.ipv4.ip_forward = 1
EOF
sysctl -q --system

say "/etc/hosts"
hosts=$(grep -v '# edgelink-lab$' /etc/hosts || true)
for pair in $CLUSTER_HOSTS; do
    hosts+=$'\n'"${pair%%=*} ${pair#*=} # edgelink-lab"
done
printf '%s\n' "$hosts" | write_if_changed /etc/hosts || true

say "packages (Kubernetes $K8S_VERSION from pkgs.k8s.io)"
install -d -m 0755 /etc/apt/keyrings
repo="https://pkgs.k8s.io/core:/stable:/v$K8S_VERSION/deb/"
keyring=/etc/apt/keyrings/kubernetes-apt-keyring.gpg
list="deb [signed-by=$keyring] $repo /"
if [[ ! -s $keyring ]] || ! grep -qxF "$list" /etc/apt/sources.list.d/kubernetes.list 2>/dev/null; then
    "${APT[@]}" update >/dev/null
    "${APT[@]}" install -y --no-install-recommends ca-certificates curl gpg >/dev/null
    curl -fsSL --retry 5 "${repo}Release.key" | gpg --dearmor --yes -o "$keyring"
    echo "$list" > /etc/apt/sources.list.d/kubernetes.list
fi
# Only what is missing: provisioning again must not upgrade a running node.
missing=()
for pkg in containerd kubelet kubeadm kubectl kubernetes-cni cri-tools conntrack ethtool iptables socat; do
    status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
    [[ $status == "install ok installed" ]] || missing+=("$pkg")
done
if ((${#missing[@]} > 0)); then
    "${APT[@]}" update >/dev/null
    "${APT[@]}" install -y --no-install-recommends "${missing[@]}" >/dev/null
fi
apt-mark hold kubelet kubeadm kubectl >/dev/null

say "containerd: systemd cgroups, the pause image kubeadm expects, CNI in /opt/cni/bin"
kube_version=$(kubeadm version -o short)
pause=$(kubeadm config images list --kubernetes-version "$kube_version" | grep '/pause:') ||
    { echo "common: kubeadm $kube_version names no pause image" >&2; exit 1; }
install -d -m 0755 /etc/containerd
conf=$(mktemp)
containerd config default > "$conf"
sed -i -e 's/SystemdCgroup = false/SystemdCgroup = true/' \
    -e "s|sandbox_image = .*|sandbox_image = \"$pause\"|" \
    -e 's|bin_dir = .*|bin_dir = "/opt/cni/bin"|' \
    -e 's|conf_dir = .*|conf_dir = "/etc/cni/net.d"|' "$conf"
for want in 'SystemdCgroup = true' "sandbox_image = \"$pause\"" 'bin_dir = "/opt/cni/bin"'; do
    grep -qF "$want" "$conf" || { echo "common: containerd config: could not set $want" >&2; exit 1; }
done
if write_if_changed /etc/containerd/config.toml < "$conf"; then
    systemctl restart containerd
fi
rm -f "$conf"
systemctl enable --now containerd >/dev/null
printf 'runtime-endpoint: unix:///run/containerd/containerd.sock\nimage-endpoint: unix:///run/containerd/containerd.sock\n' |
    write_if_changed /etc/crictl.yaml || true

say "kubelet: node IP $NODE_IP${NODE_LABELS:+, labels $NODE_LABELS}"
args="--node-ip=$NODE_IP"
[[ -z $NODE_LABELS ]] || args+=" --node-labels=$NODE_LABELS"
if echo "KUBELET_EXTRA_ARGS=$args" | write_if_changed /etc/default/kubelet; then
    # Before kubeadm has configured it the kubelet restarts in a loop anyway.
    systemctl try-restart kubelet
fi
systemctl enable kubelet >/dev/null
say "done"
