#!/usr/bin/env bash
# make e2e-vagrant: the reference cluster in VMs (vagrant/Vagrantfile), edgelink
# from the local build on kedge1, and a pod on kworker1 reaching device01-01
# through its Service over TCP, UDP and HTTP.
#
#   1. builds the image (`make image`) and saves it to vagrant/.build/ under
#      the reference daemonset/install.yaml names, qualified as containerd
#      stores it (edgelink:0.1.0 -> docker.io/library/edgelink:0.1.0);
#   2. vagrant up (kmaster, kworker1, kedge1, device01-01); the Vagrantfile
#      imports the image on kedge1;
#   3. waits for three Ready nodes, Flannel and Multus;
#   4. applies daemonset/install.yaml and waits for its DaemonSets, then
#      the NAD cni-conf/nad-forwards.yaml and cni-conf/expose-a-device/
#      (namespace hil) and waits for the Service device01-01 to have
#      endpoints;
#   5. runs vagrant/e2e-client.sh in a pod on kworker1 against
#      device01-01.<its namespace>.svc: TCP echo, UDP echo, HTTP GET.
#
# Prints PASS/FAIL per check and "N passed, M failed" last; exits 1 if a check
# failed, 2 if the lab could not be set up (no vagrant, no provider, a step
# timed out). KEEP=1 leaves the cluster up (and reuses a running one next
# time); otherwise it is destroyed at the end, also on failure.
#
# Needs vagrant and a provider: VirtualBox, or libvirt with the vagrant-libvirt
# plugin (VAGRANT_DEFAULT_PROVIDER picks one), ~7.5 GB of RAM for the VMs,
# internet access from the VMs, and docker, podman or buildah for the image.
# Settings: EDGELINK_* as in vagrant/README.md, and
#   EDGELINK_IMAGE_TAR   use this image archive instead of `make image`
#                        (it must carry the reference install.yaml names)
#   CONTAINER_BUILDER    docker, podman or buildah (default: the first
#                        installed, as for `make image`)
#   E2E_EXPOSE           what to apply for the device (default:
#                        cni-conf/nad-forwards.yaml cni-conf/expose-a-device)
#   E2E_CLIENT_IMAGE     the client pod's image (default python:3.12-alpine)
#   E2E_TIMEOUT          seconds for each wait (default 900)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
LAB=$ROOT/vagrant
BUILD=$(realpath -m "${EDGELINK_IMAGE_DIR:-$LAB/.build}")
export EDGELINK_IMAGE_DIR=$BUILD # the Vagrantfile looks there too
INSTALL=daemonset/install.yaml
# The device's NAD, then its proxy Deployment and Service. E2E_EXPOSE
# (space-separated files or directories) replaces the list.
read -ra EXPOSE <<<"${E2E_EXPOSE:-cni-conf/nad-forwards.yaml cni-conf/expose-a-device}"
SYSTEM_NS=edgelink-system
SERVICE=device01-01
CLIENT_NODE=kworker1 CLIENT_NS=edgelink-e2e
TCP_PORT=8080 UDP_PORT=5000 HTTP_PORT=80
CLIENT_IMAGE=${E2E_CLIENT_IMAGE:-docker.io/library/python:3.12-alpine}
TIMEOUT=${E2E_TIMEOUT:-900}
KEEP=${KEEP:-}
TMP='' UP=0 START=$SECONDS

die() {
    echo "e2e-vagrant: $*" >&2
    exit 2
}
say() { printf '\n== %s\n' "$*"; }

# ------------------------------------------------------------- preflight
command -v vagrant >/dev/null ||
    die "vagrant is not installed. It also needs a hypervisor provider:
  VirtualBox, or libvirt + the vagrant-libvirt plugin (Debian: apt-get install vagrant vagrant-libvirt libvirt-daemon-system).
  This cannot run where there is no hypervisor; scripts/check-vagrant.sh checks what can be checked there."
provider=${VAGRANT_DEFAULT_PROVIDER:-}
if [[ -z $provider ]]; then
    plugins=$(vagrant plugin list 2>/dev/null || true)
    if command -v VBoxManage >/dev/null && VBoxManage --version >/dev/null 2>&1; then
        provider=virtualbox
    elif command -v virsh >/dev/null && grep -q '^vagrant-libvirt' <<<"$plugins"; then
        provider=libvirt
    fi
fi
[[ -n $provider ]] ||
    die "no Vagrant provider found: install VirtualBox, or libvirt with the vagrant-libvirt plugin,
  or name one with VAGRANT_DEFAULT_PROVIDER. No hypervisor here? scripts/check-vagrant.sh checks what can be checked."
export VAGRANT_DEFAULT_PROVIDER=$provider
[[ -f $INSTALL ]] || die "$INSTALL is missing (the DaemonSet manifest)"
for path in "${EXPOSE[@]}"; do
    [[ -e $path ]] || die "$path is missing (E2E_EXPOSE)"
done

# edgelink:0.1.0 -> docker.io/library/edgelink:0.1.0, the name containerd
# keeps and the kubelet looks up.
qualify() {
    local first=${1%%/*}
    if [[ $1 != */* ]]; then
        echo "docker.io/library/$1"
    elif [[ $first == *.* || $first == *:* || $first == localhost ]]; then
        echo "$1"
    else
        echo "docker.io/$1"
    fi
}

image=$(awk '{for (i = 1; i < NF; i++) if ($i == "image:") print $(i + 1)}' "$INSTALL" |
    tr -d "\"'" | grep -m1 edgelink || true)
[[ -n $image ]] || die "$INSTALL names no edgelink image"
ref=$(qualify "$image")

say "image $image from the local build ($ref)"
mkdir -p "$BUILD"
rm -f "$BUILD/edgelink-image.ref"
if [[ -n ${EDGELINK_IMAGE_TAR:-} ]]; then
    cp "$EDGELINK_IMAGE_TAR" "$BUILD/edgelink-image.tar"
else
    # The builder `make image` uses (the Makefile's order), saved as a
    # docker-archive, which `ctr images import` reads.
    tool=${CONTAINER_BUILDER:-}
    for b in docker podman buildah; do
        [[ -z $tool ]] || break
        ! command -v "$b" >/dev/null || tool=$b
    done
    [[ -n $tool ]] || die "no container builder: install docker, podman or buildah, or set CONTAINER_BUILDER"
    make image CONTAINER_BUILDER="$tool" IMAGE="$image"
    "$tool" tag "$image" "$ref"
    rm -f "$BUILD/edgelink-image.tar"
    case ${tool##*/} in
    docker) docker save -o "$BUILD/edgelink-image.tar" "$ref" ;;
    podman) podman save --format docker-archive -o "$BUILD/edgelink-image.tar" "$ref" ;;
    buildah) buildah push "$ref" "docker-archive:$BUILD/edgelink-image.tar:$ref" ;;
    *) die "CONTAINER_BUILDER=$tool: docker, podman or buildah" ;;
    esac
fi
echo "$ref" > "$BUILD/edgelink-image.ref"

# ------------------------------------------------------------- the cluster
cleanup() {
    local rc=$?
    [[ -z $TMP ]] || rm -rf "$TMP"
    if [[ $UP == 1 ]]; then
        if [[ -n $KEEP ]]; then
            printf '\nKEEP=1: the cluster is up. Try:\n  cd vagrant && vagrant ssh kmaster -c "kubectl get pods -A -o wide"\nTear it down with:  cd vagrant && vagrant destroy -f\n'
        else
            say "vagrant destroy"
            (cd "$LAB" && vagrant destroy -f) || echo "e2e-vagrant: vagrant destroy failed" >&2
        fi
    fi
    echo "e2e-vagrant: $((SECONDS - START)) s"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

cd "$LAB"
was=$(vagrant status kedge1 --machine-readable | awk -F, '$3 == "state" {print $4}')
say "vagrant up ($provider; kedge1 was: ${was:-unknown})"
UP=1
vagrant up
if [[ $was == running ]]; then
    # A running VM is not provisioned again by `vagrant up`: import the new
    # image now, and restart the DaemonSets below.
    vagrant provision kedge1 --provision-with edgelink-image,edgelink
fi
TMP=$(mktemp -d)
vagrant ssh-config > "$TMP/ssh-config"
cd "$ROOT"

on() { # on MACHINE COMMAND...: run a shell command line there
    local host=$1
    shift
    ssh -F "$TMP/ssh-config" -o LogLevel=ERROR "$host" "$@"
}
k() { # kubectl on kmaster, arguments kept as they are
    on kmaster "kubectl $(printf '%q ' "$@")"
}
# wait_for WHAT COMMAND...: until COMMAND succeeds, TIMEOUT at most.
wait_for() {
    local what=$1 deadline=$((SECONDS + TIMEOUT))
    shift
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || die "timed out after $TIMEOUT s waiting for $what"
        sleep 5
    done
}

three_nodes() { [[ $(k get nodes -o name | wc -l) -ge 3 ]]; }
say "nodes"
wait_for "three nodes" three_nodes
k wait --for=condition=Ready node --all --timeout="${TIMEOUT}s" >/dev/null || die "nodes not Ready"
k get nodes -o wide
[[ $(k get node kedge1 -o jsonpath='{.metadata.labels.edgelink\.io/edge}') == true ]] ||
    die "kedge1 lacks the label edgelink.io/edge=true"
k -n kube-flannel rollout status ds/kube-flannel-ds --timeout="${TIMEOUT}s"
k -n kube-system rollout status ds/kube-multus-ds --timeout="${TIMEOUT}s"

say "edgelink: $INSTALL"
k apply -f - < "$INSTALL"
daemonsets=$(k -n "$SYSTEM_NS" get ds -o name)
[[ -n $daemonsets ]] || die "$INSTALL created no DaemonSet in $SYSTEM_NS"
[[ $was != running ]] || k -n "$SYSTEM_NS" rollout restart ds
for ds in $daemonsets; do
    k -n "$SYSTEM_NS" rollout status "$ds" --timeout="${TIMEOUT}s" || die "$ds did not roll out"
done

say "expose device01-01: ${EXPOSE[*]}"
manifests=()
for path in "${EXPOSE[@]}"; do
    if [[ -d $path ]]; then
        # The directory's own manifests; subdirectories hold variants.
        for f in "$path"/*.yaml "$path"/*.yml; do
            [[ ! -f $f ]] || manifests+=("$f")
        done
    else
        manifests+=("$path")
    fi
done
((${#manifests[@]} > 0)) || die "no manifests in ${EXPOSE[*]}"
# The namespaces they name are created first (the docs do it by hand).
for n in $(awk '$1 == "namespace:" {print $2}' "${manifests[@]}" | tr -d "\"'" | sort -u); do
    on kmaster "kubectl create namespace $n --dry-run=client -o yaml | kubectl apply -f - >/dev/null"
done
# One stream, in the order given: the NAD before the pods that use it.
for f in "${manifests[@]}"; do
    echo "---"
    cat "$f"
done | k apply -f - || die "kubectl apply of ${EXPOSE[*]} failed"
ns=$(k get svc -A --field-selector "metadata.name=$SERVICE" \
    -o jsonpath='{range .items[*]}{.metadata.namespace}{"\n"}{end}' | head -n 1)
[[ -n $ns ]] || die "${EXPOSE[*]} created no Service $SERVICE"
ports=$(k -n "$ns" get svc "$SERVICE" -o jsonpath='{range .spec.ports[*]}{.port}/{.protocol} {end}')
for want in "$TCP_PORT/TCP" "$UDP_PORT/UDP" "$HTTP_PORT/TCP"; do
    [[ " $ports " == *" $want "* ]] || die "Service $ns/$SERVICE has ports [$ports], not $want"
done
endpoints() {
    [[ -n $(k -n "$ns" get endpoints "$SERVICE" -o jsonpath='{.subsets[*].addresses[*].ip}') ]]
}
wait_for "endpoints of $ns/$SERVICE" endpoints
k -n "$ns" get pods -o wide
on_nodes=$(k -n "$ns" get endpoints "$SERVICE" -o jsonpath='{.subsets[*].addresses[*].nodeName}')
[[ $on_nodes == kedge1 ]] || echo "e2e-vagrant: warning: $SERVICE's pods run on [$on_nodes], expected kedge1 only" >&2

say "client pod on $CLIENT_NODE -> $SERVICE.$ns.svc"
on kmaster 'rm -rf /tmp/edgelink-e2e && mkdir -p /tmp/edgelink-e2e'
scp -q -F "$TMP/ssh-config" -o LogLevel=ERROR scripts/lab/echo.py vagrant/e2e-client.sh kmaster:/tmp/edgelink-e2e/
on kmaster "kubectl create namespace $CLIENT_NS --dry-run=client -o yaml | kubectl apply -f - >/dev/null &&
    kubectl -n $CLIENT_NS delete pod client --ignore-not-found --wait >/dev/null &&
    kubectl -n $CLIENT_NS create configmap client --from-file=/tmp/edgelink-e2e/ --dry-run=client -o yaml |
    kubectl apply -f - >/dev/null"
k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: client
  namespace: $CLIENT_NS
spec:
  nodeSelector:
    kubernetes.io/hostname: $CLIENT_NODE
  restartPolicy: Never
  containers:
  - name: client
    image: $CLIENT_IMAGE
    command: ["sh", "/e2e/e2e-client.sh", "$SERVICE.$ns.svc", "$TCP_PORT", "$UDP_PORT", "$HTTP_PORT"]
    volumeMounts:
    - {name: e2e, mountPath: /e2e}
  volumes:
  - {name: e2e, configMap: {name: client}}
EOF
finished() {
    local phase
    phase=$(k -n "$CLIENT_NS" get pod client -o jsonpath='{.status.phase}')
    [[ $phase == Succeeded || $phase == Failed ]]
}
wait_for "the client pod to finish" finished
out=$(k -n "$CLIENT_NS" logs client)
echo "$out"

passed=$(grep -c '^PASS ' <<<"$out" || true)
failed=$(grep -c '^FAIL ' <<<"$out" || true)
if ((passed != 3)); then
    failed=$((3 - passed))
    say "diagnostics"
    k get pods -A -o wide || true
    for ds in $daemonsets; do
        k -n "$SYSTEM_NS" logs "$ds" --all-containers --tail=40 || true
        k -n "$SYSTEM_NS" exec "$ds" -- edgelinkd status || true
    done
fi
echo
echo "$passed passed, $failed failed"
((failed == 0)) || exit 1
