# shellcheck shell=bash
# shellcheck disable=SC2034  # the variables are used by the scripts that source this
# The current profile's (KUBE=1.36) machines and cables, all in network
# namespaces of the lab's own (sourced by up.sh and down.sh, after common.sh):
#
#            k136-switch (bridge sw0, 10.251.0.0/24: the nodes' network)
#         ┌────────────┬─────────────┬──────────────┐
#       eth0         eth0          eth0           eth0
#   k136-kcp      k136-kw1     k136-kedge1     k136-kedge2
#   .10 control   .11 worker   .12 edge        .13 edge
#   plane, node   (clients)        eth1            eth1
#                                   └──── k136-segment (bridge seg0) ────┘
#                                        k136-device01-01   k136-device01-02
#                                        172.17.16.120      172.17.16.121
#
# Each node also gets a private mount namespace (its own /opt, /etc/cni,
# /var/lib, /var/log, /run), so hostPath volumes, pod namespaces, kubelet
# and containerd state never touch the host nor each other. The pod
# network: each node's podCIDR (from the controller-manager) behind its own
# bridge, and a route on every other node to it through the switch.

NODES=(kcp kw1 kedge1 kedge2)
EDGE_NODES=(kedge1 kedge2)
DEVICES=(device01-01 device01-02)
PREFIX=k136
SWITCH_NS=$PREFIX-switch
SEGMENT_NS=$PREFIX-segment
NODE_NET=10.251.0
CLUSTER_CIDR=10.89.0.0/16
# Room for a plant (make bench-scale: 1000 Devices, a Service each).
SERVICE_CIDR=10.0.0.0/20
API_SERVICE_IP=10.0.0.1
DNS_SERVICE_IP=10.0.0.10
SEGMENT_NET=172.17.16

node_ns() { echo "$PREFIX-$1"; }
device_ns() { echo "$PREFIX-$1"; }
node_ip() {
  local i
  for i in "${!NODES[@]}"; do [[ ${NODES[$i]} == "$1" ]] && { echo "$NODE_NET.$((10 + i))"; return 0; }; done
  die "no node $1"
}
device_ip() {
  local i
  for i in "${!DEVICES[@]}"; do [[ ${DEVICES[$i]} == "$1" ]] && { echo "$SEGMENT_NET.$((120 + i))"; return 0; }; done
  die "no device $1"
}
API_IP=$NODE_NET.10
is_edge() { [[ " ${EDGE_NODES[*]} " == *" $1 "* ]]; }

has_ns() { ip netns list | awk '{print $1}' | grep -qx "$1"; }
# make_ns NAME: made once, recorded for `down`.
make_ns() {
  has_ns "$1" || { ip netns add "$1"; echo "$1" >>"$RUN/netns.created"; }
  ip -n "$1" link set lo up
}

# The switch, the segment and their cables (idempotent).
topology_up() {
  local n ns ip d dns
  make_ns "$SWITCH_NS"
  make_ns "$SEGMENT_NS"
  ip -n "$SWITCH_NS" link show sw0 >/dev/null 2>&1 || ip -n "$SWITCH_NS" link add sw0 type bridge
  ip -n "$SWITCH_NS" link set sw0 up
  ip -n "$SEGMENT_NS" link show seg0 >/dev/null 2>&1 || ip -n "$SEGMENT_NS" link add seg0 type bridge
  ip -n "$SEGMENT_NS" link set seg0 up
  for n in "${NODES[@]}"; do
    ns=$(node_ns "$n"); ip=$(node_ip "$n")
    make_ns "$ns"
    if ! ip -n "$ns" link show eth0 >/dev/null 2>&1; then
      ip -n "$ns" link add eth0 type veth peer name "$n" netns "$SWITCH_NS"
      ip -n "$SWITCH_NS" link set "$n" master sw0 up
      ip -n "$ns" addr add "$ip/24" dev eth0
      ip -n "$ns" link set eth0 up
    fi
    # A default route onto the switch, which leads nowhere beyond the
    # nodes: a connect to a ClusterIP from the node itself (hostNetwork
    # pods: Multus thick's daemon asks the API at 10.0.0.1) needs a route
    # before kube-proxy's DNAT rewrites it.
    ip -n "$ns" route replace default dev eth0
    if is_edge "$n" && ! ip -n "$ns" link show eth1 >/dev/null 2>&1; then
      ip -n "$ns" link add eth1 type veth peer name "$n" netns "$SEGMENT_NS"
      ip -n "$SEGMENT_NS" link set "$n" master seg0 up
      ip -n "$ns" link set eth1 up
    fi
  done
  for d in "${DEVICES[@]}"; do
    dns=$(device_ns "$d")
    make_ns "$dns"
    if ! ip -n "$dns" link show eth0 >/dev/null 2>&1; then
      ip -n "$dns" link add eth0 type veth peer name "$d" netns "$SEGMENT_NS"
      ip -n "$SEGMENT_NS" link set "$d" master seg0 up
      ip -n "$dns" addr add "$(device_ip "$d")/24" dev eth0
      ip -n "$dns" link set eth0 up
    fi
  done
}

# pod_routes: every node routes each other node's podCIDR to that node.
pod_routes() {
  local n m cidr
  for n in "${NODES[@]}"; do
    for m in "${NODES[@]}"; do
      [[ $n == "$m" ]] && continue
      cidr=$(pod_cidr "$m")
      [[ -n $cidr ]] || die "node $m has no podCIDR yet"
      ip -n "$(node_ns "$n")" route replace "$cidr" via "$(node_ip "$m")" dev eth0
    done
  done
}

# devices_up: each device serves TCP echo on 8080, UDP echo on 5000 and a
# web page on 80 (scripts/lab/echo.py), recorded as <device>-<tcp|udp|http>.
devices_up() {
  local d
  for d in "${DEVICES[@]}"; do
    device_serve "$d" tcp serve 8080
    device_serve "$d" udp serve-udp 5000
    device_serve "$d" http serve-http 80
  done
}
device_serve() {
  local d=$1 what=$2 mode=$3 port=$4
  [[ -n $(recorded_pid "$d-$what") ]] && return 0
  setsid ip netns exec "$(device_ns "$d")" python3 "$REPO/scripts/lab/echo.py" "$mode" "$(device_ip "$d")" "$port" \
    </dev/null >>"$RUN/logs/$d-$what.log" 2>&1 &
  record_pid "$d-$what" $!
}
# devices_down: stop them (a process outlives its network namespace).
devices_down() {
  local d w pids=()
  for d in "${DEVICES[@]}"; do
    for w in tcp udp http; do pids+=("$(recorded_pid "$d-$w")"); done
  done
  mapfile -t pids < <(printf '%s\n' "${pids[@]}" | grep .)
  if ((${#pids[@]})); then log "stopping ${#pids[@]} device servers"; stop_pids "${pids[@]}"; fi
}
