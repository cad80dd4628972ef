#!/usr/bin/env bash
# make bench-scale (docs/benchmarks.md, "Plant scale"): the control plane
# and one edge node at the scale of a plant, on the kube lab (KUBE=1.36).
#
#   SCALE_DEVICES Devices (default 1000) on one EdgeNetwork, applied at
#   once, every other one pinned to kedge1 and kedge2, 4 ports each (TCP
#   8080, 8081, 80, UDP 5000): each edge node holds SCALE_DEVICES/2 proxy
#   pods, that is attachments of 4 forwards, made by the real runtime
#   (kubelet, containerd 2, Multus thick, the plugin).
#
# Printed: the time until all are Reconciled and until all are Ready; the
# operator's API requests per reconcile and per report (from its own
# counters, edgelink_operator_*api_requests*), in a quiet minute once all
# are Ready; its memory and CPU; on kedge1: edgelinkd's RSS, fds, the last
# reconcile pass, /status and /metrics size and latency, the webhook's
# bytes per second; the plugin's ADD on kedge1 before the Devices and
# with them (add-timing.py); then the time until the deleted Devices'
# StatefulSets and pods are gone.
#
# The lab comes up through e2e.sh (checks 1a and O1: DaemonSet, operator)
# unless SCALE_REUSE=1 (a lab left up by KEEP=1); it goes down at the end
# unless KEEP=1. The Devices use a subnet of their own on the segment
# (172.17.24.0/21: a /24 holds too few proxies), which the lab's device
# answers on besides its own (an address and echo servers added here,
# removed at the end).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
# shellcheck source=scripts/kube-lab/common.sh
. "$HERE/common.sh"
[[ $KUBE != 1.20 ]] || die "make bench-scale needs the current profile (KUBE=1.36): two edge nodes"
# shellcheck source=scripts/kube-lab/current/topology.sh
. "$HERE/current/topology.sh"
# shellcheck source=scripts/kube-lab/current/node.sh
. "$HERE/current/node.sh"
[[ $(id -u) == 0 ]] || die "run as root"

N=${SCALE_DEVICES:-1000}
WAIT=${SCALE_WAIT:-1800}
QUIET=${SCALE_QUIET:-60}
ADD_ROUNDS=${SCALE_ADD_ROUNDS:-30}
SUBNET=172.17.24
TARGET=$SUBNET.120
DEV_NS=$(device_ns device01-01)
KC_NS=$(node_ns kcp)
OPNS=edgelink-system
kc() { ip netns exec "$KC_NS" "$BIN/kubectl" --kubeconfig "$RUN/kube/admin.kubeconfig" --request-timeout 60s "$@"; }
say() { printf '[bench-scale] %s\n' "$*"; }
ms_since() { echo $((($(date +%s%N) - $1) / 1000000)); }
sub() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a - b }'; }

ECHO_PIDS=()
cleanup() {
  local rc=$?
  set +e
  if [[ -z ${SCALE_KEEP_DEVICES:-} ]]; then
    kc -n hil delete devices -l edgelink.io/bench-scale=true --wait=false >/dev/null 2>&1
    kc delete edgenetwork plant-scale --wait=false >/dev/null 2>&1
  fi
  # (setsid may fork: the servers are found by their command line)
  ((${#ECHO_PIDS[@]})) && pkill -f "scripts/lab/echo.py [a-z-]* $TARGET " 2>/dev/null
  ip -n "$DEV_NS" addr del "$TARGET/21" dev eth0 2>/dev/null
  if [[ -z ${KEEP:-} ]]; then "$REPO/scripts/kube-lab.sh" down >/dev/null 2>&1 || true; fi
  exit $rc
}
trap cleanup EXIT

if [[ -z ${SCALE_REUSE:-} ]]; then
  say "the lab, the DaemonSet and the operator (e2e.sh, checks 1a and O1)"
  KEEP=1 E2E_ONLY='^(1a|O1 )' "$HERE/e2e.sh" | grep -E '^(PASS|FAIL)' || true
fi
kc -n "$OPNS" rollout status deployment/edgelink-operator --timeout 120s >/dev/null ||
  die "no edgelink-operator in the lab"

# --- one kernel's neighbour tables ---------------------------------------------------------------
# The ARP and NDP tables are the kernel's, shared by every namespace, with
# one bound (gc_thresh3, 1024 by default): the lab's nodes are namespaces
# of one kernel, so N proxy pods (each with the device as a neighbour) and
# the device (with each of them) pass it at a few hundred Devices, and the
# kernel drops what it cannot resolve ("neighbour table overflow"): the
# health probes time out. A real node has its own kernel and its own
# pods only. Raised for the bench, restored by `down`.
for fam in ipv4 ipv6; do
  raise_sysctl "net.$fam.neigh.default.gc_thresh1" 8192
  raise_sysctl "net.$fam.neigh.default.gc_thresh2" 16384
  raise_sysctl "net.$fam.neigh.default.gc_thresh3" 32768
done

# --- the device answers on the bench subnet too -------------------------------------------------
ip -n "$DEV_NS" addr replace "$TARGET/21" dev eth0
for s in "serve 8080" "serve 8081" "serve-udp 5000" "serve-http 80"; do
  # shellcheck disable=SC2086 # mode and port
  setsid ip netns exec "$DEV_NS" python3 "$REPO/scripts/lab/echo.py" ${s%% *} "$TARGET" ${s##* } \
    </dev/null >>"$RUN/logs/bench-scale-echo.log" 2>&1 &
  ECHO_PIDS+=($!)
done

# --- figures of the operator and of kedge1 -----------------------------------------------------
leader() { kc -n "$OPNS" get lease edgelink-operator -o jsonpath='{.spec.holderIdentity}'; }
LEADER=$(leader)
LIP=$(kc -n "$OPNS" get pod "$LEADER" -o jsonpath='{.status.podIP}')
op_metrics() { ip netns exec "$KC_NS" curl -fsS --max-time 10 "http://$LIP:8080/metrics"; }
# metric TEXT NAME [LABEL_SUBSTRING]: the sum of its samples
metric() { awk -v m="$2" -v l="${3:-}" '($1 == m || index($1, m"{") == 1) && index($1, l) { s += $2 } END { printf "%.6f\n", s }' <<<"$1"; }
# the pid of a process whose command line holds $1 and whose cgroup is node $2's
# (or, for the operator, whose environment has HOSTNAME=$2)
pid_of_node() {
  local p
  for p in $(pgrep -f "$1"); do
    grep -q "/$PREFIX-$2/" "/proc/$p/cgroup" 2>/dev/null && { echo "$p"; return 0; }
  done
  return 1
}
pid_of_pod() {
  local p
  for p in $(pgrep -f "$1"); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "HOSTNAME=$2" && { echo "$p"; return 0; }
  done
  return 1
}
rss_mib() { awk '/^VmRSS/ { printf "%.1f\n", $2 / 1024 }' "/proc/$1/status" 2>/dev/null || echo 0; }
# (0 for a process that is gone: a leader that lost its Lease exits)
cpu_s() { awk -v t="$(getconf CLK_TCK)" '{ printf "%.2f\n", ($14 + $15) / t }' "/proc/$1/stat" 2>/dev/null || echo 0; }
fds() { find "/proc/$1/fd" -mindepth 1 -maxdepth 1 | wc -l; }
on_kedge1() { nsenter --mount="$(node_dir kedge1)/ns/mnt" --net="/run/netns/$(node_ns kedge1)" "$@"; }
# size and time of one GET of edgelinkd's status endpoint on kedge1
fetch() { on_kedge1 curl -fsS --max-time 10 -o /dev/null -w '%{size_download} %{time_total}\n' "http://127.0.0.1:9310$1"; }

OP_PID=$(pid_of_pod edgelink-operator "$LEADER") || die "no process of the leader $LEADER"
ELKD=$(pid_of_node "edgelinkd" kedge1) || die "no edgelinkd on kedge1"
say "leader $LEADER (pid $OP_PID, $LIP); edgelinkd on kedge1 pid $ELKD; $(nproc) cores, $(free -g | awk '/^Mem/ {print $2}') GiB"

# The plugin's ADD on kedge1, with the node's state: a config like a
# Device's (4 forwards), addresses of its own in the bench subnet.
ADD_CONF=$(cat <<JSON
{"cniVersion": "1.0.0", "name": "bench-add-timing", "type": "edgelink", "mode": "bridge",
 "bridge": "edge0", "uplink": "eth1",
 "ipam": {"ranges": [[{"subnet": "$SUBNET.0/21", "rangeStart": "172.17.31.200", "rangeEnd": "172.17.31.250"}]]},
 "forwards": [{"name": "api", "protocol": "tcp", "port": 8080, "target": "$TARGET:8080"},
              {"name": "alt", "protocol": "tcp", "port": 8081, "target": "$TARGET:8081"},
              {"name": "http", "protocol": "tcp", "port": 80, "target": "$TARGET:80"},
              {"name": "telemetry", "protocol": "udp", "port": 5000, "target": "$TARGET:5000"}],
 "allowedTargets": ["$TARGET/32"]}
JSON
)
add_timing() { on_kedge1 python3 "$HERE/add-timing.py" "$ADD_ROUNDS" <<<"$ADD_CONF"; }
ATT0=$(metric "$(on_kedge1 curl -fsS http://127.0.0.1:9310/metrics)" edgelink_attachments)
ADD1=$(add_timing)
say "ADD on kedge1 at ${ATT0%.*} attachments ($ADD_ROUNDS rounds): $ADD1"

# --- apply -------------------------------------------------------------------------------------
# The EdgeNetwork first, then the Devices in 8 files created side by side
# (one kubectl, one request per object, took 232 s for 1000 while the
# pods started).
yaml=$RUN/bench-scale
rm -rf "$yaml" && mkdir -p "$yaml"
cat >"$yaml/network.yaml" <<YAML
apiVersion: edgelink.io/v1alpha1
kind: EdgeNetwork
metadata: {name: plant-scale}
spec:
  mode: bridge
  bridge: edge0
  uplink: eth1
  ipam:
    ranges:
    - {node: kedge1, subnet: $SUBNET.0/21, rangeStart: 172.17.24.130, rangeEnd: 172.17.27.250}
    - {node: kedge2, subnet: $SUBNET.0/21, rangeStart: 172.17.28.10, rangeEnd: 172.17.31.190}
  allowedTargets: [$TARGET/32]
YAML
for ((i = 1; i <= N; i++)); do
  node=kedge$((1 + i % 2))
  {
    printf -- '---\napiVersion: edgelink.io/v1alpha1\nkind: Device\nmetadata: {name: plant-%04d, namespace: hil, labels: {edgelink.io/bench-scale: "true"}}\n' "$i"
    printf 'spec: {nodeName: %s, network: plant-scale, address: %s, ports: [{name: api, protocol: tcp, port: 8080}, {name: alt, protocol: tcp, port: 8081}, {name: http, protocol: tcp, port: 80}, {name: telemetry, protocol: udp, port: 5000}]}\n' "$node" "$TARGET"
  } >>"$yaml/devices-$((i % 8)).yaml"
done
kc create namespace hil >/dev/null 2>&1 || true
m0=$(op_metrics)
cpu0=$(cpu_s "$OP_PID")
kc create -f "$yaml/network.yaml" >/dev/null
t0=$(date +%s%N)
creates=()
for f in "$yaml"/devices-*.yaml; do
  kc create -f "$f" >/dev/null &
  creates+=($!)
done
wait "${creates[@]}"
created=$(ms_since "$t0")
say "$N Devices created in $created ms (8 kubectl create -f side by side, one request per Device)"

states() {
  kc -n hil get devices -l edgelink.io/bench-scale=true -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Reconciled")].status}/{.status.conditions[?(@.type=="Ready")].status} {end}' |
    tr ' ' '\n' | awk -F/ '$1 == "True" { r++ } $2 == "True" { y++ } END { printf "%d %d\n", r, y }'
}
reconciled_ms="" ready_ms="" peak_op=0 peak_elkd=0
while :; do
  read -r rec rdy < <(states || echo "0 0")
  el=$(ms_since "$t0")
  [[ -z $reconciled_ms ]] && ((rec >= N)) && reconciled_ms=$el
  ((rdy >= N)) && { ready_ms=$el; break; }
  peak_op=$(awk -v a="$peak_op" -v b="$(rss_mib "$OP_PID")" 'BEGIN { print (b > a ? b : a) }')
  peak_elkd=$(awk -v a="$peak_elkd" -v b="$(rss_mib "$ELKD")" 'BEGIN { print (b > a ? b : a) }')
  printf '[bench-scale] %6.1f s: %d Reconciled, %d Ready; pods on kedge1 %s\n' "$(awk -v e="$el" 'BEGIN { printf "%.1f", e / 1000 }')" "$rec" "$rdy" \
    "$(metric "$(on_kedge1 curl -fsS http://127.0.0.1:9310/metrics)" edgelink_attachments | cut -d. -f1)"
  ((el / 1000 < WAIT)) || break
  sleep 10
done
restarts() { kc -n "$OPNS" get pod "$LEADER" -o jsonpath='{.status.containerStatuses[0].restartCount}'; }
say "the leader's restarts: $(restarts) (its memory limit: $(kc -n "$OPNS" get pod "$LEADER" -o jsonpath='{.spec.containers[0].resources.limits.memory}'))"
say "all Reconciled after ${reconciled_ms:-never (in $WAIT s)} ms; all Ready after ${ready_ms:-never (in $WAIT s)} ms"
if [[ -d /proc/$OP_PID ]]; then
  m1=$(op_metrics)
  cpu1=$(cpu_s "$OP_PID")
  rc_n=$(sub "$(metric "$m1" edgelink_operator_reconciles_total)" "$(metric "$m0" edgelink_operator_reconciles_total)")
  say "meanwhile: $rc_n reconciles, operator CPU $(sub "$cpu1" "$cpu0") s, peak RSS operator $peak_op MiB, edgelinkd (kedge1) $peak_elkd MiB"
else
  # The leader exited (a lost Lease: the API server too slow to renew
  # it); its counters went with it. The quiet minute is the new one's.
  say "the leader $LEADER (pid $OP_PID) exited during the run: $(kc -n "$OPNS" get pod "$LEADER" -o jsonpath='{.status.containerStatuses[0].lastState.terminated.reason} at {.status.containerStatuses[0].lastState.terminated.finishedAt}'); its counters went with it; peak RSS operator $peak_op MiB, edgelinkd (kedge1) $peak_elkd MiB"
  until_leader=$((SECONDS + 120))
  while LEADER=$(leader) && ! OP_PID=$(pid_of_pod edgelink-operator "$LEADER"); do
    ((SECONDS < until_leader)) || die "no leader's process within 120 s"
    sleep 2
  done
  LIP=$(kc -n "$OPNS" get pod "$LEADER" -o jsonpath='{.status.podIP}')
  say "the leader now: $LEADER (pid $OP_PID, $LIP)"
fi

# --- a quiet minute ----------------------------------------------------------------------------
say "waiting 35 s (one --resync), then a quiet ${QUIET} s"
sleep 35
q0=$(op_metrics)
e0=$(on_kedge1 curl -fsS http://127.0.0.1:9310/metrics)
c0=$(cpu_s "$OP_PID")
ec0=$(cpu_s "$ELKD")
sleep "$QUIET"
q1=$(op_metrics)
e1=$(on_kedge1 curl -fsS http://127.0.0.1:9310/metrics)
c1=$(cpu_s "$OP_PID")
ec1=$(cpu_s "$ELKD")
python3 - "$QUIET" <<PY
import re, sys
quiet = float(sys.argv[1])
def parse(t):
    out = {}
    for line in t.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        k, v = line.rsplit(" ", 1)
        out[k] = float(v)
    return out
q0, q1 = parse("""$q0"""), parse("""$q1""")
e0, e1 = parse("""$e0"""), parse("""$e1""")
d = lambda a, b, k: b.get(k, 0) - a.get(k, 0)
reconciles = sum(d(q0, q1, k) for k in q1 if k.startswith("edgelink_operator_reconciles_total"))
by = {}
for k in q1:
    m = re.match(r'edgelink_operator_api_requests_total\{(.*)\}', k)
    if m:
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        n = d(q0, q1, k)
        if n:
            by[(labels["verb"], labels["resource"])] = n
reads = sum(n for (v, _), n in by.items() if v in ("get", "list"))
writes = sum(n for (v, _), n in by.items() if v not in ("get", "list", "watch"))
rr = d(q0, q1, "edgelink_operator_reconcile_api_requests_sum")
rc = d(q0, q1, "edgelink_operator_reconcile_api_requests_count")
reports = d(q0, q1, "edgelink_operator_reports_total")
beats = d(q0, q1, "edgelink_operator_heartbeats_total")
trig = d(q0, q1, "edgelink_operator_report_triggered_reconciles_total")
pr = d(q0, q1, "edgelink_operator_report_api_requests_sum")
print("[bench-scale] quiet %.0f s: %d reconciles (%.1f/s), API requests %s" % (quiet, reconciles, reconciles / quiet,
      ", ".join("%s %s %d" % (v, r, n) for (v, r), n in sorted(by.items())) or "none"))
print("[bench-scale] per reconcile: %.2f API requests (%d in %d reconciles; reads in the window %d, writes %d)" % (rr / max(rc, 1), rr, rc, reads, writes))
print("[bench-scale] per report: %.2f API requests, %.2f reconciles asked (%d reports, %d heartbeats, %d asked)" % (pr / max(reports + beats, 1), trig / max(reports, 1), reports, beats, trig))
rb = d(e0, e1, "edgelink_webhook_report_bytes_total")
hb = d(e0, e1, "edgelink_webhook_heartbeat_bytes_total")
rp = d(e0, e1, "edgelink_webhook_reports_total")
hp = d(e0, e1, "edgelink_webhook_heartbeats_total")
print("[bench-scale] webhook from kedge1: %.0f B/s (%d reports of %.0f KiB each, %d heartbeats of %.0f B)" % ((rb + hb) / quiet, rp, rb / max(rp, 1) / 1024, hp, hb / max(hp, 1)))
PY
say "quiet: operator CPU $(sub "$c1" "$c0") s, RSS $(rss_mib "$OP_PID") MiB; edgelinkd (kedge1) CPU $(sub "$ec1" "$ec0") s, RSS $(rss_mib "$ELKD") MiB, fds $(fds "$ELKD")"
att=$(metric "$e1" edgelink_attachments | cut -d. -f1)
passes=()
for _ in 1 2 3 4 5; do
  passes+=("$(metric "$(on_kedge1 curl -fsS http://127.0.0.1:9310/metrics)" edgelink_reconcile_pass_seconds)")
  sleep 6
done
say "kedge1: $att attachments; last reconcile pass (5 samples, s): ${passes[*]}"
for p in /status /metrics; do
  sizes=() times=()
  for _ in 1 2 3 4 5; do read -r s t < <(fetch "$p"); sizes+=("$s"); times+=("$t"); done
  say "kedge1 $p: ${sizes[0]} bytes; times (s): ${times[*]}"
done
ADD500=$(add_timing)
say "ADD on kedge1 at $att attachments ($ADD_ROUNDS rounds): $ADD500 (at ${ATT0%.*}: $ADD1)"

# --- delete ------------------------------------------------------------------------------------
gone() { local o; o=$(kc -n hil get statefulsets,pods -o name) || return 1; ! grep -q '/plant-' <<<"$o"; }
devices_gone() { [[ -z $(kc -n hil get devices -l edgelink.io/bench-scale=true -o name) ]]; }
t0=$(date +%s%N)
kc -n hil delete devices -l edgelink.io/bench-scale=true --wait=false >/dev/null
dev_ms="" all_ms=""
while :; do
  el=$(ms_since "$t0")
  [[ -z $dev_ms ]] && devices_gone && dev_ms=$el
  gone && { all_ms=$el; break; }
  ((el / 1000 < WAIT)) || break
  sleep 2
done
kc delete edgenetwork plant-scale --wait=false >/dev/null
say "deleted: Devices gone after ${dev_ms:-never} ms, their StatefulSets and pods after ${all_ms:-never (in $WAIT s)} ms"
[[ -n $ready_ms && -n $all_ms ]]
