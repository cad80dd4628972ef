#!/usr/bin/env bash
# kworker1 and kedge1: join the cluster with the bootstrap token the
# Vagrantfile gave kmaster. Waits for the API server first (with the libvirt
# provider the VMs come up in parallel). Node labels (edgelink.io/edge=true on
# kedge1) are the kubelet's --node-labels, set by common.sh.
#
# The CA is not pinned (--discovery-token-unsafe-skip-ca-verification): the
# token is secret to this lab and authenticates the cluster-info it signs.
#
# Env: MASTER_IP, KUBEADM_TOKEN. Runs as root after common.sh; a node that
# has joined is left alone.
set -euo pipefail
: "${MASTER_IP:?}" "${KUBEADM_TOKEN:?}"
WAIT=${JOIN_WAIT:-1200} # seconds

say() { echo "join: $*"; }

if [[ -f /etc/kubernetes/kubelet.conf ]]; then
    say "$(hostname) has joined already"
    exit 0
fi

say "waiting for the API server at $MASTER_IP:6443 (up to $WAIT s)"
deadline=$((SECONDS + WAIT))
until curl -fsk --max-time 5 "https://$MASTER_IP:6443/readyz" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
        echo "join: the API server at $MASTER_IP:6443 did not become ready in $WAIT s" >&2
        exit 1
    fi
    sleep 5
done

# kmaster creates the token late in kubeadm init: retry the join a few times.
for attempt in 1 2 3 4 5; do
    say "kubeadm join $MASTER_IP:6443 (attempt $attempt)"
    if kubeadm join "$MASTER_IP:6443" --token "$KUBEADM_TOKEN" \
        --discovery-token-unsafe-skip-ca-verification --node-name "$(hostname)"; then
        say "done"
        exit 0
    fi
    kubeadm reset -f >/dev/null 2>&1 || true
    sleep 15
done
echo "join: kubeadm join failed 5 times" >&2
exit 1
