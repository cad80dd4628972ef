# shellcheck shell=bash
# The end-to-end checks of edgelink-operator (issue 11) on the kube lab:
# sourced by e2e.sh after its own checks, on the same cluster, with its
# helpers (kc, check, note, until_ok, is, at_least, differs, on_node, in_pod_netns, pod_netns, client_netns,
# ECHO) and its client pod hil/client. docs/kube-lab.md lists the checks.
#
# The operator runs in the cluster (daemonset/operator/, the image
# edgelink:<version> that `make image-offline` builds carries it): the lab
# advertises the node's address, so the `kubernetes` Service has endpoints
# and in-cluster config works. The 1.20 lab has no cluster DNS, so there
# the edgelinkd-webhook ConfigMap gets the webhook Service's ClusterIP
# instead of its name; 1.36 keeps the name.

OP_DIR=$REPO/daemonset/operator
# the CRDs with CEL rules need 1.31 or later; 1.20 to 1.30 take the same
# schemas without them (docs/operator.md)
CRDS=$OP_DIR/crds.yaml
[[ $KUBE == 1.20 ]] && CRDS=$OP_DIR/crds-1.20.yaml
OPNS=edgelink-system
DEV=device01-02               # the Device the checks make (device01-01 is the hand-written one of check 2)
DEV_POD=$DEV-0
DEV_YAML=$RUN/e2e-$DEV.yaml

# device_yaml [API_PORT] [HTTP_TIMEOUT_MS]: cni-conf/device01-01.yaml renamed to $DEV
device_yaml() {
  local api=${1:-8080} http_to=${2:-2000}
  sed -e "s/name: device01-01\$/name: $DEV/" \
    -e "s/{name: api, protocol: tcp, port: 8080}/{name: api, protocol: tcp, port: $api, targetPort: 8080}/" \
    -e "s/connectTimeoutMs: 2000/connectTimeoutMs: $http_to/" \
    "$REPO/cni-conf/device01-01.yaml" >"$DEV_YAML"
  grep -q "name: $DEV\$" "$DEV_YAML"
}
cond() { # cond DEVICE TYPE: "status reason"
  kc -n hil get device "$1" -o jsonpath="{.status.conditions[?(@.type==\"$2\")].status} {.status.conditions[?(@.type==\"$2\")].reason}"
}
cond_is() { [[ $(cond "$1" "$2") == "$3 "* ]]; }
leader() { kc -n "$OPNS" get lease edgelink-operator -o jsonpath='{.spec.holderIdentity}'; }
op_metric() { # op_metric POD_IP NAME: the sum of its samples
  ip netns exec "$NODE_NS" curl -fsS --max-time 5 "http://$1:8080/metrics" |
    awk -v m="$2" '$1 == m || index($1, m"{") == 1 { s += $2 } END { printf "%d\n", s }'
}
webhook_ip() { kc -n "$OPNS" get endpoints edgelink-operator-webhook -o jsonpath='{.subsets[0].addresses[0].ip}'; }
jp() { kc -n hil get "$1" "$2" -o jsonpath="$3"; } # jp KIND NAME JSONPATH
sts_rolled() { [[ $(jp statefulset "$DEV" '{.status.updateRevision}') == "$(jp statefulset "$DEV" '{.status.currentRevision}')" ]]; }
all_true() {
  cond_is "$DEV" Reconciled True && cond_is "$DEV" Ready True && cond_is "$DEV" DeviceReachable True
}

# --- O1. the operator installs, one replica leads, edgelinkd reports to it ---------------------------------
o1_install() {
  local ip holder lip
  kc apply -f "$CRDS" >/dev/null || return 1
  kc wait --for condition=established --timeout 30s crd/devices.edgelink.io crd/edgenetworks.edgelink.io >/dev/null || return 1
  # edgelinkd reports with its ServiceAccount token (no Secret); the lab's
  # bridge plugin ignores the NetworkPolicy, which the API server checks.
  kc apply -f "$OP_DIR/rbac.yaml" -f "$OP_DIR/operator.yaml" -f "$OP_DIR/networkpolicy.yaml" >/dev/null || return 1
  ip=$(kc -n "$OPNS" get svc edgelink-operator-webhook -o jsonpath='{.spec.clusterIP}')
  # 1.36 has cluster DNS: the ConfigMap's URL by name, as shipped
  if [[ $KUBE == 1.20 ]]; then
    kc -n "$OPNS" patch configmap edgelinkd-webhook --type merge \
      -p "{\"data\":{\"EDGELINKD_STATUS_WEBHOOK\":\"http://$ip:8080/v1/status\"}}" >/dev/null || return 1
  fi
  kc -n "$OPNS" rollout status deployment/edgelink-operator --timeout 120s >/dev/null || {
    kc -n "$OPNS" logs -l app.kubernetes.io/name=edgelink-operator --tail 20 | sed 's/^/     | /'
    return 1
  }
  # No restart of edgelinkd: it reads the URL from the ConfigMap's volume
  # while it runs (--status-webhook-file), within the kubelet's sync of
  # the volume (about a minute).
  local t0=$SECONDS
  until_ok 30 differs "" leader || return 1
  holder=$(leader)
  lip=$(kc -n "$OPNS" get pod "$holder" -o jsonpath='{.status.podIP}')
  LEADER_IP=$lip
  until_ok 30 is "$lip" webhook_ip || return 1
  # edgelinkd's first report reaches the leader
  until_ok 150 at_least 1 op_metric "$lip" edgelink_operator_reports_total || return 1
  note "2 replicas ready; leader $holder ($lip); webhook Service $ip -> $lip; first report $((SECONDS - t0)) s after the URL was set, edgelinkd not restarted; reports taken: $(op_metric "$lip" edgelink_operator_reports_total)"
}
check "O1 operator: CRDs, RBAC, 2 replicas ready, one holds the Lease, the webhook Endpoints lead to it, edgelinkd reports (the patched URL taken without a restart)" o1_install

# --- O2. bad Devices are refused by the apiserver with the schema's message ---------------------------------
# refused FIELDS WANT: a Device with FIELDS (YAML lines under spec, after
# the defaults they override) must be refused with WANT in the message
refused() {
  local fields=$1 want=$2 out spec
  spec="  nodeName: $NODE"$'\n'"  network: plant-floor"
  [[ $fields == *address:* ]] || spec+=$'\n'"  address: 172.17.16.120"
  [[ $fields == *ports:* ]] || spec+=$'\n'"  ports: [{name: api, protocol: tcp, port: 80}]"
  if out=$(printf 'apiVersion: edgelink.io/v1alpha1\nkind: Device\nmetadata: {name: bad-device}\nspec:\n%s\n  %s\n' "$spec" "$fields" |
    kc -n hil apply -f - 2>&1); then
    note "accepted: $fields"
    return 1
  fi
  [[ $out == *"$want"* ]] || { note "wrong message for $fields: $out"; return 1; }
  note "refused: $fields: ...${out##*: spec.}"
}
o2_refused() {
  local ok=0 i out
  local -a bad=(
    "ports: [{name: api, protocol: tcp, port: 70000}]|65535"
    "ports: [{name: telemetry-channel1, protocol: udp, port: 5000}]|15"
    "ports: [{name: API, protocol: tcp, port: 80}]|^[a-z0-9]([-a-z0-9]*[a-z0-9])?\$"
    "ports: [{name: api, protocol: sctp, port: 80}]|supported values: \"tcp\", \"udp\""
    "ports: [{name: api, protocol: tcp, port: 80}, {name: api, protocol: udp, port: 81}]|Duplicate value"
    "ports: []|should have at least 1 items"
    "address: 300.1.2.3|ipv4"
    "address: device01|ipv4"
    "nodeSelector: {a: b}|oneOf"
  )
  # the CEL rules (crds.yaml, 1.31 and later): what only the controller
  # reported before
  [[ $KUBE == 1.20 ]] || bad+=(
    "ports: [{name: telemetry, protocol: udp, port: 5000, maxConnections: 4}]|is only valid with protocol tcp (telemetry is udp)"
    "ports: [{name: api, protocol: tcp, port: 80}, {name: web, protocol: tcp, port: 80}]|two entries have the same port and protocol"
    "address: 224.0.0.1|is not a unicast address"
  )
  for i in "${bad[@]}"; do
    refused "${i%%|*}" "${i#*|}" || ok=1
  done
  out=$(printf 'apiVersion: edgelink.io/v1alpha1\nkind: Device\nmetadata: {name: bad-device}\nspec: {nodeName: %s}\n' "$NODE" |
    kc -n hil apply -f - 2>&1) && ok=1
  # kubectl's own check against the published schema answers first
  [[ ($out == *"spec.address: Required value"* && $out == *"spec.ports: Required value"*) ||
    ($out == *'missing required field "address"'* && $out == *'missing required field "ports"'*) ]] || ok=1
  note "refused without address and ports: ...${out##*: spec}"
  out=$(printf 'apiVersion: edgelink.io/v1alpha1\nkind: EdgeNetwork\nmetadata: {name: bad-net}\nspec:\n  uplink: "eth1:0"\n  ipam: {ranges: [{node: %s, subnet: 172.17.16.0}]}\n' "$NODE" |
    kc apply -f - 2>&1) && ok=1
  [[ $out == *"subnet in body must be of type cidr"* && $out == *"uplink in body should match"* ]] || ok=1
  note "EdgeNetwork with uplink eth1:0 and subnet 172.17.16.0 refused: ...${out#*invalid: }"
  ! kc -n hil get device bad-device >/dev/null 2>&1 && ! kc get edgenetwork bad-net >/dev/null 2>&1 && ((ok == 0))
}
O2_CEL=""
[[ $KUBE == 1.20 ]] || O2_CEL=", and on 1.36 by its CEL rules (a relay key on UDP, a port twice, a multicast address)"
check "O2 bad Devices (port, name, protocol, duplicate, address, node choice, required fields) and a bad EdgeNetwork refused at apply with the schema's message$O2_CEL" o2_refused

# --- O3. a Device makes its NAD, StatefulSet and Service, and its status fills in ----------------------------
o3_apply() {
  local t0=$SECONDS k o
  kc apply -f "$REPO/cni-conf/edgenetwork-plant-floor.yaml" >/dev/null || return 1
  device_yaml && kc apply -f "$DEV_YAML" >/dev/null || return 1
  until_ok 90 all_true || {
    kc -n hil get device "$DEV" -o jsonpath='{.status}' | sed 's/^/     | /'
    return 1
  }
  for k in network-attachment-definitions statefulset service; do
    o=$(kc -n hil get "$k" "$DEV" -o jsonpath='{.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name} {.metadata.managedFields[*].manager}') || return 1
    note "$k/$DEV: owner $o"
    [[ $o == "Device/$DEV "*edgelink-operator* ]] || return 1
  done
  note "all conditions True in $((SECONDS - t0)) s; kubectl -n hil get devices:"
  # One listing, read whole: `kubectl ... | head -n 1` under pipefail
  # failed when head closed the pipe before kubectl had written its last
  # line (SIGPIPE; seen once).
  local table
  table=$(kc -n hil get devices) || return 1
  local line
  while IFS= read -r line; do echo "     | $line"; done <<<"$table"
  grep -q '^NAME *READY *REACHABLE *NODES *LAST-SEEN *ADDRESS *PORTS *AGE' <<<"$table" &&
    grep -Eq "^$DEV +True +1/1 +$NODE +[0-9smh]+ +172\.17\.16\.120 +8080/tcp,5000/udp,80/tcp " <<<"$table"
}
check "O3 Device $DEV: NAD, StatefulSet, Service owned by it (field manager edgelink-operator); Reconciled, Ready, DeviceReachable True; kubectl get devices" o3_apply

o3_status() {
  local st
  st=$(kc -n hil get device "$DEV" -o json | python3 -c '
import json, sys
s = json.load(sys.stdin)["status"]
ports = {p["name"]: p for p in s["ports"]}
assert s["node"] == sys.argv[1] and s["pod"] == sys.argv[2], s
assert s["segmentAddress"].startswith("172.17.16.2"), s
assert all(p["listening"] for p in ports.values()), ports
assert ports["api"]["reachable"] in ("True", "Unknown"), ports
n = s["nodes"][0]
assert n["node"] == sys.argv[1] and n["reachable"] == "True" and n["ready"], n
print(s["node"], s["pod"], s["segmentAddress"], " ".join(n + ":" + p["listener"] + "/" + p["reachable"] for n, p in ports.items()),
      "| node:", n["reachable"], n["reason"], n.get("latency"), n.get("lastSeen"))
' "$NODE" "$DEV_POD") || return 1
  note "status: $st"
}
check "O3b status: node, proxy pod, its segment address, per port listening; the node's health probe reaches the device (status.nodes)" o3_status

# --- O4. a client pod reaches the device through the Service the Device made -------------------------------
o4_traffic() {
  local svc out
  svc=$(kc -n hil get svc "$DEV" -o jsonpath='{.spec.clusterIP}')
  CLIENT_NETNS=$(client_netns)
  until_ok 30 in_pod_netns "$CLIENT_NETNS" timeout 3 python3 "$ECHO" ping "$svc" 8080 1 || return 1
  out=$(in_pod_netns "$CLIENT_NETNS" python3 "$ECHO" ping "$svc" 8080 20) || return 1
  note "TCP $svc:8080 from the client pod: $out"
  out=$(in_pod_netns "$CLIENT_NETNS" python3 "$ECHO" udp-ping "$svc" 5000 5) || return 1
  note "UDP $svc:5000: $out"
  out=$(in_pod_netns "$CLIENT_NETNS" python3 "$ECHO" http-get "$svc" 80 3) || return 1
  note "HTTP $svc:80: $out"
  # the counters come back in the status (at the next report and resync):
  # 20 round trips of 64 bytes on one connection
  until_ok 60 at_least 1280 jp device "$DEV" '{.status.ports[?(@.name=="api")].bytesToDevice}' || return 1
  note "status counts api: $(kc -n hil get device "$DEV" -o jsonpath='{.status.ports[?(@.name=="api")].totalConnections} connections, {.status.ports[?(@.name=="api")].bytesToDevice} bytes to the device')"
}
check "O4 client pod -> Service $DEV (made by the operator): TCP, UDP, HTTP reach the device; status counts the bytes" o4_traffic

# --- O5. editing the ports converges: Service, NAD, proxy pod replaced, traffic on the new port ----------------
o5_edit() {
  local uid0 uid1 svc out
  uid0=$(kc -n hil get pod "$DEV_POD" -o jsonpath='{.metadata.uid}')
  device_yaml 8081 && kc apply -f "$DEV_YAML" >/dev/null || return 1
  until_ok 90 is 8081 jp svc "$DEV" '{.spec.ports[?(@.name=="api")].port}' || return 1
  until_ok 120 is "8081 true" jp device "$DEV" '{.status.ports[?(@.name=="api")].port} {.status.ports[?(@.name=="api")].listening}' || return 1
  until_ok 60 all_true || return 1
  uid1=$(kc -n hil get pod "$DEV_POD" -o jsonpath='{.metadata.uid}')
  kc -n hil get network-attachment-definitions "$DEV" -o jsonpath='{.spec.config}' | grep -q '"port": 8081' || return 1
  svc=$(kc -n hil get svc "$DEV" -o jsonpath='{.spec.clusterIP}')
  # kube-proxy programs the new port and the replaced pod's endpoint on its
  # own schedule (a run saw the first connect time out): up to 30 s.
  until_ok 30 in_pod_netns "$CLIENT_NETNS" python3 "$ECHO" ping "$svc" 8081 1 || return 1
  out=$(in_pod_netns "$CLIENT_NETNS" python3 "$ECHO" ping "$svc" 8081 5) || return 1
  note "Service port api 8081, NAD forward 8081 -> :8080, proxy pod replaced ($([[ $uid0 != "$uid1" ]] && echo yes)), TCP $svc:8081: $out"
  [[ $uid0 != "$uid1" ]] && ! in_pod_netns "$CLIENT_NETNS" timeout 3 python3 "$ECHO" ping "$svc" 8080 1 >/dev/null 2>&1
}
check "O5 api port 8080 -> 8081 (targetPort 8080): Service, NAD and proxy pod converge, 8081 relays, 8080 is gone" o5_edit

# --- O6. a hand-made object of the same name is reported, not overwritten -----------------------------------
o6_conflict() {
  local rv0 rv1 c owners
  rv0=$(kc -n hil get svc device01-01 -o jsonpath='{.metadata.resourceVersion}') || return 1
  kc apply -f "$REPO/cni-conf/device01-01.yaml" >/dev/null || return 1
  until_ok 30 cond_is device01-01 Reconciled False || return 1
  c=$(kc -n hil get device device01-01 -o jsonpath='{.status.conditions[?(@.type=="Reconciled")].reason}: {.status.conditions[?(@.type=="Reconciled")].message}')
  note "$c"
  sleep 5
  rv1=$(kc -n hil get svc device01-01 -o jsonpath='{.metadata.resourceVersion}')
  owners=$(kc -n hil get svc,statefulset,network-attachment-definitions device01-01 -o jsonpath='{.items[*].metadata.ownerReferences[*].kind}')
  note "the hand-made Service's resourceVersion $rv0 -> $rv1; owner kinds of the hand-made objects: [${owners}]"
  kc -n hil delete device device01-01 --wait=true >/dev/null
  kc -n hil get svc device01-01 >/dev/null || return 1
  [[ $c == "Conflict: "*"Service hil/device01-01 exists"* && $rv0 == "$rv1" && $owners != *Device* ]]
}
check "O6 Device device01-01 beside the hand-made objects of check 2: Conflict in status, the Service untouched (and kept when the Device goes)" o6_conflict

# --- O7. the operator restarted mid-reconcile: the standby takes over and converges -------------------------------
o7_restart() {
  local old new t0=$SECONDS
  old=$(leader)
  device_yaml 8081 3000 && kc apply -f "$DEV_YAML" >/dev/null || return 1
  # at once: the leader is reconciling the edit (or about to)
  kc -n "$OPNS" delete pod "$old" --grace-period=0 --force >/dev/null 2>&1
  until_ok 60 differs "$old" leader || return 1
  new=$(leader)
  until_ok 120 sts_rolled || return 1
  kc -n hil get network-attachment-definitions "$DEV" -o jsonpath='{.spec.config}' | grep -q '"connectTimeoutMs": 3000' || return 1
  until_ok 90 all_true || return 1
  LEADER_IP=$(kc -n "$OPNS" get pod "$new" -o jsonpath='{.status.podIP}')
  until_ok 60 is "$LEADER_IP" webhook_ip || return 1
  kc -n "$OPNS" rollout status deployment/edgelink-operator --timeout 120s >/dev/null || return 1
  note "leader $old killed during the edit; $new leads, webhook -> $LEADER_IP; edit converged, all True after $((SECONDS - t0)) s"
}
check "O7 leader killed (--force) right after an edit: the standby takes the Lease and the webhook, the edit converges" o7_restart

# --- O8. DeviceReachable follows the device ------------------------------------------------------------------
o8_reachable() {
  local t0 down up
  until_ok 60 cond_is "$DEV" DeviceReachable True || return 1
  ip -n "$DEVICE_NS" link set eth0 down
  t0=$SECONDS
  until_ok 30 cond_is "$DEV" DeviceReachable False
  down=$((SECONDS - t0))
  note "device link down: $(cond "$DEV" DeviceReachable) after $down s: $(kc -n hil get device "$DEV" -o jsonpath='{.status.conditions[?(@.type=="DeviceReachable")].message}')"
  ip -n "$DEVICE_NS" link set eth0 up
  t0=$SECONDS
  until_ok 60 cond_is "$DEV" DeviceReachable True
  up=$((SECONDS - t0))
  note "device link up: $(cond "$DEV" DeviceReachable) after $up s"
  cond_is "$DEV" DeviceReachable True && ((down < 30))
}
check "O8 device down: DeviceReachable False within 30 s; back up: True again" o8_reachable

# --- O9. deleting the Device deletes what it made ---------------------------------------------------------------
# (kubectl's answer is kept before grep looks at it: a failed kubectl must
# not read as "none left", nor grep -q's early exit fail the pipe.)
dev_objects() { local o; o=$(kc -n hil get network-attachment-definitions,statefulset,service,pod -o name) || return 2; grep "/$DEV" <<<"$o"; }
dev_gone() { dev_objects >/dev/null; [[ $? == 1 ]]; }
o9_delete() {
  local t0=$SECONDS left
  kc -n hil delete device "$DEV" >/dev/null || return 1
  until_ok 90 dev_gone
  left=$(dev_objects | tr '\n' ' ')
  note "after $((SECONDS - t0)) s left: [${left}]"
  [[ -z $left ]]
}
check "O9 Device deleted: its NAD, StatefulSet, Service and proxy pod are gone" o9_delete

# --- O11. the kernel path and the device's protection, from a Device (issue 12) ------------------------------
# api and telemetry through the proxy pod's own kernel (nftables DNAT that
# edgelinkd installs with the image's nft, sysctls through the DaemonSet's
# /proc/sys/net mount), http through the relay with a queue in front.
KDEV=device01-03
node_status() { ip netns exec "$NODE_NS" curl -fsS --max-time 5 http://127.0.0.1:9310/status; }
fwd_field() { # fwd_field POD FORWARD FIELD: from edgelinkd's /status on the node
  node_status | python3 -c '
import json, sys
pod, fwd, field = sys.argv[1:]
for a in json.load(sys.stdin)["attachments"]:
    if a.get("podName") == pod:
        for f in a["forwards"]:
            if f["name"] == fwd:
                print(f.get(field)); sys.exit(0)
sys.exit(1)' "$@"
}
o11_kernel() {
  local svc out ns table
  kc apply -f - >/dev/null <<YAML || return 1
apiVersion: edgelink.io/v1alpha1
kind: Device
metadata: {name: $KDEV, namespace: hil}
spec:
  nodeName: $NODE
  network: plant-floor
  address: 172.17.16.120
  ports:
  - {name: api, protocol: tcp, port: 8080, path: kernel}
  - {name: telemetry, protocol: udp, port: 5000, path: kernel}
  - {name: http, protocol: tcp, port: 80, maxConnections: 4, queueTimeoutMs: 10000, connectRetries: 1}
YAML
  until_ok 120 cond_is "$KDEV" Ready True || { kc -n hil get device "$KDEV" -o jsonpath='{.status}' | sed 's/^/     | /'; return 1; }
  svc=$(kc -n hil get svc "$KDEV" -o jsonpath='{.spec.clusterIP}')
  # kube-proxy on the client's node rejects a Service without endpoints
  # until its next sync has the new ones (seen once across nodes on 1.36)
  until_ok 30 in_pod_netns "$CLIENT_NETNS" timeout 3 python3 "$ECHO" ping "$svc" 8080 1 || return 1
  out=$(in_pod_netns "$CLIENT_NETNS" python3 "$ECHO" ping "$svc" 8080 20) || return 1
  note "TCP $svc:8080 through the kernel path: $out"
  out=$(in_pod_netns "$CLIENT_NETNS" python3 "$ECHO" udp-ping "$svc" 5000 5) || return 1
  note "UDP $svc:5000 through the kernel path: $out"
  out=$(in_pod_netns "$CLIENT_NETNS" python3 "$ECHO" http-get "$svc" 80 3) || return 1
  note "HTTP $svc:80 through the relay (maxConnections 4): $out"
  # (an API call of pod_netns timed out once under CI's load: looked up again)
  until_ok 30 differs "" pod_netns hil "$KDEV-0" || { note "no network namespace found for $KDEV-0"; return 1; }
  ns=$(pod_netns hil "$KDEV-0")
  table=$(in_pod_netns "$ns" nft list table inet edgelink) || return 1
  note "proxy pod's table: $(grep -c ' dnat ip to ' <<<"$table") DNAT rules, $(grep -c 'masquerade' <<<"$table") masquerade; ip_forward $(in_pod_netns "$ns" cat /proc/sys/net/ipv4/ip_forward), TIME_WAIT $(in_pod_netns "$ns" cat /proc/sys/net/netfilter/nf_conntrack_tcp_timeout_time_wait) s"
  [[ $(grep -c ' dnat ip to ' <<<"$table") == 2 && $(in_pod_netns "$ns" cat /proc/sys/net/netfilter/nf_conntrack_tcp_timeout_time_wait) == 65 ]] || return 1
  until_ok 30 at_least 1 fwd_field "$KDEV-0" api packetsToTarget || return 1
  note "edgelinkd /status: api path $(fwd_field "$KDEV-0" api path), $(fwd_field "$KDEV-0" api totalConnections) connections, $(fwd_field "$KDEV-0" api packetsToTarget) packets to the device; http maxConnections $(fwd_field "$KDEV-0" http maxConnections)"
  [[ $(fwd_field "$KDEV-0" api path) == kernel && $(fwd_field "$KDEV-0" http maxConnections) == 4 ]] || return 1
  kc -n hil delete device "$KDEV" >/dev/null
}
check "O11 Device with kernel-path ports (api, telemetry) and a queued relay port (http): the proxy pod's nft table, TCP, UDP, HTTP through the Service, packets in edgelinkd's /status" o11_kernel

# --- O12. Device.spec.reverse: a Service named, rendered as its ClusterIP (issue 14) ----------------------
# The collector of check 10 (e2e-reverse.sh): its Service `collector`,
# ingest 9000/tcp and ingest-udp 9000/udp. One entry names the port by name
# and leaves protocol to the schema's default, the other by number (the
# Service's 9000 of protocol udp). The schema's oneOf (service or target)
# refuses both and neither at apply: the 1.20 apiserver takes the CRD's
# per-field default, int-or-string and oneOf.
RDEV=device01-04
rev_status() { # rev_status: "name listener target service totalConnections ..." per entry
  kc -n hil get device "$RDEV" -o json | python3 -c '
import json, sys
for r in json.load(sys.stdin).get("status", {}).get("reverse", []):
    print(r.get("name"), r.get("protocol"), r.get("port"), r.get("target"), r.get("service"), r.get("listener"), r.get("totalConnections"))'
}
o12_reverse() {
  local ok=0 conf seg pod_ip out word st proto
  refused "reverse: [{name: both, port: 9000, service: {name: collector}, target: \"10.0.0.9:9000\"}]" "oneOf" || ok=1
  refused "reverse: [{name: neither, port: 9000}]" "oneOf" || ok=1
  [[ -n $COLL_IP ]] || { note "no collector (check 10)"; return 1; }
  kc apply -f - >/dev/null <<YAML || return 1
apiVersion: edgelink.io/v1alpha1
kind: Device
metadata: {name: $RDEV, namespace: hil}
spec:
  nodeName: $NODE
  network: plant-floor
  address: 172.17.16.120
  ports:
  - {name: api, protocol: tcp, port: 8080}
  reverse:
  - {name: ingest, port: 9000, service: {name: collector, port: ingest}}
  - {name: ingest-udp, protocol: udp, port: 9000, service: {name: collector, port: 9000}, connectTimeoutMs: 2000}
YAML
  proto=$(kc -n hil get device "$RDEV" -o jsonpath='{.spec.reverse[0].protocol}')
  note "stored spec.reverse[0].protocol: ${proto:-(none)} (the schema's default)"
  [[ $proto == tcp ]] || ok=1
  until_ok 120 all_true_of "$RDEV" || { kc -n hil get device "$RDEV" -o jsonpath='{.status.conditions}' | sed 's/^/     | /'; return 1; }
  note "ReverseResolved: $(kc -n hil get device "$RDEV" -o jsonpath='{.status.conditions[?(@.type=="ReverseResolved")].status} {.status.conditions[?(@.type=="ReverseResolved")].message}')"
  conf=$(kc -n hil get network-attachment-definitions "$RDEV" -o jsonpath='{.spec.config}')
  out=$(python3 -c 'import json,sys; print(" ".join("%s=%s/%s->%s" % (r["name"], r["port"], r["protocol"], r["target"]) for r in json.loads(sys.argv[1]).get("reverse", [])))' "$conf")
  note "NAD $RDEV reverse: $out"
  [[ $out == "ingest=9000/tcp->$COLL_IP:9000 ingest-udp=9000/udp->$COLL_IP:9000" ]] || ok=1
  seg=$(kc -n hil get device "$RDEV" -o jsonpath='{.status.segmentAddress}')
  pod_ip=$(kc -n hil get pod "$RDEV-0" -o jsonpath='{.status.podIP}')
  word=o12-tcp-$RANDOM
  out=$(dev_call tcp "$seg" 9000 "$word") || ok=1
  note "device -> $seg:9000/tcp (status.segmentAddress): $out"
  from_pod "$out" "$word" "$pod_ip" || ok=1
  word=o12-udp-$RANDOM
  out=$(dev_call udp "$seg" 9000 "$word") || ok=1
  note "device -> $seg:9000/udp: $out"
  from_pod "$out" "$word" "$pod_ip" || ok=1
  # the counters come back with the next report
  until_ok 60 rev_counted || ok=1
  note "kubectl get device $RDEV -o yaml, status.reverse:"
  kc -n hil get device "$RDEV" -o yaml | awk '/^status:/ { s = 1 } s && /^  reverse:/ { p = 1 } p && /^  [^ -]/ && !/^  reverse:/ { p = 0 } p' |
    sed 's/^/     | /'
  st=$(rev_status)
  grep -q "^ingest tcp 9000 $COLL_IP:9000 hil/collector listening [1-9]" <<<"$st" &&
    grep -q "^ingest-udp udp 9000 $COLL_IP:9000 hil/collector listening [1-9]" <<<"$st" || ok=1
  kc -n hil delete device "$RDEV" >/dev/null
  ((ok == 0))
}
all_true_of() { cond_is "$1" Reconciled True && cond_is "$1" Ready True && cond_is "$1" ReverseResolved True; }
rev_counted() { [[ $(rev_status | awk '$7 >= 1' | wc -l) == 2 ]]; }
check "O12 Device with spec.reverse naming the Service collector (port by name, protocol defaulted; port by number, udp): NAD carries its ClusterIP:9000, the device reaches the collector through the proxy pod's net1 (TCP, UDP), status.reverse; both and neither of service/target refused (oneOf)" o12_reverse

# --- O10. fifty Devices at once: the time until all are Ready and reachable, and until all are gone -----------
# A rig's worth of devices (OP_SCALE, default 50) on an EdgeNetwork of its
# own (addresses .150-.199 of the segment, unused by the other checks), all
# pointing at the lab's one device. Figures printed: time to all Ready and
# DeviceReachable, reconciles and their mean duration, time to all gone.
SCALE_N=${OP_SCALE:-50}
scale_states() {
  kc -n hil get devices -l edgelink.io/e2e-scale=true \
    -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}/{.status.conditions[?(@.type=="DeviceReachable")].status} {end}'
}
scale_ready() { [[ $(scale_states | tr ' ' '\n' | grep -c '^True/True$') -eq $SCALE_N ]]; }
scale_gone() { local o; o=$(kc -n hil get statefulsets,pods -o name) || return 1; ! grep -q '/scale-' <<<"$o"; }
o10_scale() {
  local i f=$RUN/e2e-scale.yaml t0 ready gone r0 r1 d0 d1 lip
  lip=$(kc -n "$OPNS" get pod "$(leader)" -o jsonpath='{.status.podIP}')
  {
    cat <<YAML
apiVersion: edgelink.io/v1alpha1
kind: EdgeNetwork
metadata: {name: plant-floor-scale}
spec:
  mode: bridge
  bridge: edge0
  uplink: eth1
  ipam:
    ranges: [{node: $NODE, subnet: 172.17.16.0/24, rangeStart: 172.17.16.150, rangeEnd: 172.17.16.199}]
  allowedTargets: [172.17.16.120/32]
YAML
    for ((i = 1; i <= SCALE_N; i++)); do
      printf -- '---\napiVersion: edgelink.io/v1alpha1\nkind: Device\nmetadata: {name: scale-%02d, namespace: hil, labels: {edgelink.io/e2e-scale: "true"}}\n' "$i"
      printf 'spec: {nodeName: %s, network: plant-floor-scale, address: 172.17.16.120, ports: [{name: api, protocol: tcp, port: 8080}]}\n' "$NODE"
    done
  } >"$f"
  r0=$(op_metric "$lip" edgelink_operator_reconciles_total)
  d0=$(ip netns exec "$NODE_NS" curl -fsS --max-time 5 "http://$lip:8080/metrics" | awk '$1 == "edgelink_operator_reconcile_duration_seconds_sum" { print $2 }')
  t0=$(date +%s%N)
  kc apply -f "$f" >/dev/null || return 1
  until_ok 600 scale_ready
  ready=$((($(date +%s%N) - t0) / 1000000))
  r1=$(op_metric "$lip" edgelink_operator_reconciles_total)
  d1=$(ip netns exec "$NODE_NS" curl -fsS --max-time 5 "http://$lip:8080/metrics" | awk '$1 == "edgelink_operator_reconcile_duration_seconds_sum" { print $2 }')
  note "$SCALE_N Devices: $(scale_states | tr ' ' '\n' | grep -c '^True/True$') Ready and reachable after $ready ms; $((r1 - r0)) reconciles, mean $(python3 -c "print(round(1000 * ($d1 - $d0) / max(1, $r1 - $r0), 1))") ms"
  scale_ready || return 1
  t0=$(date +%s%N)
  kc -n hil delete devices -l edgelink.io/e2e-scale=true --wait=false >/dev/null || return 1
  until_ok 300 scale_gone
  gone=$((($(date +%s%N) - t0) / 1000000))
  kc delete edgenetwork plant-floor-scale >/dev/null
  note "deleted: their StatefulSets and pods gone after $gone ms"
  scale_gone
}
check "O10 $SCALE_N Devices applied at once: all Ready and reachable, then all gone (times and reconciles printed)" o10_scale
