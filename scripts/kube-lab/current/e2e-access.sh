# shellcheck shell=bash
# Who may use a device (issue 26), on the current profile (KUBE=1.36),
# after the operator's checks (O1 installed it): sourced by e2e.sh with its
# helpers (kc, check, note, until_ok, is, at_least, differs, in_pod_netns,
# pod_netns, cond, cond_is, ds_pod, NODE=kedge1, NODE_NS, CLIENT_NODE=kw1,
# CLIENT_IMAGE, ECHO, REPO, RUN).
#
#   A1  source addresses: a Device device01-06 in hil whose allowedClients
#       select the namespace team-a; a client pod in team-a and one in
#       team-b, both on kw1. kube-proxy (nftables) keeps a pod's source
#       address on its way to a ClusterIP: edgelinkd's audit line of the
#       team-a pod's connection has the pod's IP as clientAddress. A
#       connection from kw1's own netns (what a hostNetwork pod is) is
#       printed with the address edgelinkd saw, and must be refused.
#   A2  allowedClients across namespaces: AccessEnforced True; TCP from
#       team-a echoed, from team-b reset; edgelink_refused_by_policy_total
#       of the forward; the NetworkPolicy device01-06 owned by the Device;
#       the audit lines (closed for team-a/client, refused-by-policy for
#       team-b's address).
#   A3  leases through Jobs: Jobs hil-a and hil-b in team-a (admitted by
#       the namespaceSelector), their pods annotated edgelink.io/lease:
#       hil/device01-06. hil-a echoes for ~20 s (each must work); hil-b,
#       started 5 s later, tries until one works. hil-a's lease Held and
#       hil-b's Waiting (position 1) while hil-a runs; hil-b's attempts
#       meanwhile never reach the device (refused-by-lease, queue-timeout:
#       the api port's queueTimeoutMs is 3000); hil-a done: its lease
#       Released, hil-b's Held (the seconds printed), hil-b's echo works.
#   A4  `edgelinkd audit --device hil/device01-06 --since 1h` in the
#       DaemonSet pod on kedge1 has a row for every line of /audit, and
#       `kubectl logs` of edgelinkd has the same lines ("kind":"audit").
#   A5  clean-up: the Device, the Jobs, the namespaces; the NetworkPolicy
#       and the leases go with their owners.
#
# A2-A5 need A1 (it makes the Device and the client pods).

A_DEV=device01-06
A_POD=$A_DEV-0
A_SVC=
A_IP_A='' A_IP_B=''
A_NODE_SEEN=

# a_ping NAMESPACE POD [N]: N round trips through the Service's api port
# from the pod's netns: "ok ..." or the error's last line (exit status kept)
a_ping() {
  local ns out rc=0
  ns=$(pod_netns "$1" "$2") || return 1
  [[ -n $ns ]] || { echo "no netns for $1/$2"; return 1; }
  out=$(in_pod_netns "$ns" timeout 10 python3 "$ECHO" ping "$A_SVC" 8080 "${3:-3}" 2>&1) || rc=$?
  tail -n 1 <<<"$out"
  return "$rc"
}
# a_audit: the Device's lines of edgelinkd's /audit on kedge1, one a line:
# EPOCH ENDED CLIENT_ADDRESS CLIENT LEASE TO_DEVICE TO_CLIENT MS
a_audit_raw() { ip netns exec "$NODE_NS" curl -fsS --max-time 5 "http://127.0.0.1:9310/audit?device=hil%2F$A_DEV&since=1h"; }
a_audit() {
  a_audit_raw | python3 -c '
import datetime, json, sys
for l in sys.stdin:
    if not l.strip():
        continue
    r = json.loads(l)
    t = datetime.datetime.fromisoformat(r["time"].replace("Z", "+00:00")).timestamp()
    print("%.3f %s %s %s %s %d %d %d" % (t, r["ended"], r["clientAddress"], r["client"], r.get("lease") or "-",
          r["bytesToDevice"], r["bytesToClient"], r["durationMs"]))'
}
# a_has ENDED ADDRESS: an audit line of that client that ended so
a_has() { a_audit | awk -v e="$1" -v a="$2" '$2 == e && $3 == a { n++ } END { exit !n }'; }
# a_metric NAME: the sum of its samples for the Device's proxy pod's api
a_metric() {
  ip netns exec "$NODE_NS" curl -fsS --max-time 5 http://127.0.0.1:9310/metrics |
    awk -v m="$1" -v p="pod=\"$A_POD\"" '$1 ~ "^"m"[{]" && index($1, p) && index($1, "forward=\"api\"") { s += $2 } END { printf "%d\n", s }'
}
a_metrics() {
  local m out=""
  for m in refused_by_policy refused_by_lease access_resets lease_waits lease_wait_timeouts; do
    out+="$m $(a_metric "edgelink_${m}_total"), "
  done
  echo "${out%, }"
}
a_dls() { local t; t=$(kc get dls -A 2>&1) || true; while IFS= read -r l; do note "| $l"; done <<<"$t"; }
a_pod_ready() { is True kc -n "$1" get pod "$2" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}'; }
# the DaemonSet's running pod on kedge1 (8b and F6 leave terminating ones for a while)
a_ds_pod() {
  kc -n edgelink-system get pods -l app.kubernetes.io/component=node-daemon \
    --field-selector "spec.nodeName=$NODE,status.phase=Running" \
    -o jsonpath='{range .items[*]}{.metadata.name}{" "}{.metadata.deletionTimestamp}{"\n"}{end}' |
    awk 'NF == 1 { print $1; exit }'
}

a1_sources() {
  local ns out kw1_ip line
  kc wait --for condition=established --timeout 30s crd/deviceleases.edgelink.io >/dev/null || return 1
  kc apply -f "$REPO/cni-conf/edgenetwork-plant-floor.yaml" >/dev/null || return 1
  for ns in team-a team-b; do
    kc create namespace "$ns" >/dev/null 2>&1 || true
    # a pod of a new namespace is refused until its ServiceAccount exists
    until_ok 30 kc -n "$ns" get serviceaccount default || { note "no ServiceAccount default in $ns"; return 1; }
    kc -n "$ns" apply -f - >/dev/null <<YAML || return 1
apiVersion: v1
kind: Pod
metadata: {name: client}
spec:
  nodeName: $CLIENT_NODE
  containers:
  - {name: client, image: $CLIENT_IMAGE, imagePullPolicy: Never}
YAML
  done
  kc apply -f - >/dev/null <<YAML || return 1
apiVersion: edgelink.io/v1alpha1
kind: Device
metadata: {name: $A_DEV, namespace: hil}
spec:
  nodeName: $NODE
  network: plant-floor
  address: 172.17.16.120
  ports:
  - {name: api, protocol: tcp, port: 8080, queueTimeoutMs: 3000}
  access:
    allowedClients:
    - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: team-a}}
YAML
  local t0=$SECONDS
  if ! until_ok 60 a_pod_ready team-a client || ! until_ok 60 a_pod_ready team-b client; then note "client pods not Ready"; return 1; fi
  until_ok 120 cond_is "$A_DEV" Ready True || { note "status: $(kc -n hil get device "$A_DEV" -o jsonpath='{.status.conditions}')"; return 1; }
  until_ok 60 cond_is "$A_DEV" AccessEnforced True || { note "AccessEnforced: $(cond "$A_DEV" AccessEnforced)"; return 1; }
  A_SVC=$(kc -n hil get svc "$A_DEV" -o jsonpath='{.spec.clusterIP}')
  A_IP_A=$(kc -n team-a get pod client -o jsonpath='{.status.podIP}')
  A_IP_B=$(kc -n team-b get pod client -o jsonpath='{.status.podIP}')
  note "Device $A_DEV Ready, AccessEnforced $(cond "$A_DEV" AccessEnforced) after $((SECONDS - t0)) s; Service $A_SVC; team-a/client $A_IP_A, team-b/client $A_IP_B (both on $CLIENT_NODE)"
  # the node's next heartbeat carries the rules (0.5 s); kube-proxy on kw1
  # may not have the new Service's endpoint yet (trap of O4, O11)
  sleep 2
  until_ok 30 a_ping team-a client 1 || { note "team-a: $(a_ping team-a client 1)"; return 1; }
  out=$(a_ping team-a client 3) || { note "team-a: $out"; return 1; }
  note "team-a/client -> $A_SVC:8080: $out"
  until_ok 10 a_has closed "$A_IP_A" || { note "no closed line for $A_IP_A; /audit: $(a_audit | tail -n 3 | tr '\n' ';')"; return 1; }
  line=$(a_audit | awk -v a="$A_IP_A" '$2 == "closed" && $3 == a' | tail -n 1)
  note "audit: $line"
  # kw1's own netns: what a hostNetwork pod on kw1 is
  kw1_ip=$(node_ip kw1)
  local t_node
  t_node=$(date +%s.%N)
  out=$(ip netns exec "$(node_ns kw1)" timeout 10 python3 "$ECHO" ping "$A_SVC" 8080 1 2>&1 | tail -n 1) || true
  note "from kw1's netns (hostNetwork; node $kw1_ip) -> $A_SVC:8080: $out"
  A_NODE_SEEN=
  local i
  for ((i = 0; i < 20; i++)); do
    # (the kubelet's readiness probe of the proxy pod, every 10 s from
    # kedge1, has lines of its own: the one from kw1 is looked for first)
    A_NODE_SEEN=$(a_audit | awk -v t="$t_node" -v k="$kw1_ip" '$1 >= t && $3 == k' | tail -n 1)
    [[ -n $A_NODE_SEEN ]] || A_NODE_SEEN=$(a_audit | awk -v t="$t_node" -v a="$A_IP_A" -v b="$A_IP_B" '$1 >= t && $3 != a && $3 != b' | tail -n 1)
    [[ -n $A_NODE_SEEN ]] && break
    sleep 0.5
  done
  note "audit: ${A_NODE_SEEN:-none}"
  local seen=${A_NODE_SEEN#* * }
  seen=${seen%% *}
  note "edgelinkd saw the hostNetwork client as $seen ($([[ $seen == "$kw1_ip" ]] && echo "kw1's node address: kube-proxy masquerades traffic from outside the cluster CIDR" || echo "not kw1's node address $kw1_ip"))"
  [[ $line == *" closed $A_IP_A team-a/client "* && $A_NODE_SEEN == *" refused-by-policy "* && -n $seen && $seen != "$A_IP_A" ]]
}
check "A1 source addresses: kube-proxy (nftables) keeps the client pod's address on its way to Device $A_DEV's ClusterIP (audit clientAddress = pod IP); a connection from kw1's own netns (hostNetwork) is seen with another address and refused (printed)" a1_sources

a2_policy() {
  local out ok=1 np before after
  before=$(a_metric edgelink_refused_by_policy_total)
  out=$(a_ping team-a client 3) || ok=0
  note "team-a/client ($A_IP_A): $out"
  if out=$(a_ping team-b client 3); then
    note "team-b/client ($A_IP_B): ECHOED: $out"
    ok=0
  else
    note "team-b/client ($A_IP_B): $out"
  fi
  until_ok 10 at_least $((before + 1)) a_metric edgelink_refused_by_policy_total || ok=0
  after=$(a_metric edgelink_refused_by_policy_total)
  note "edgelink_refused_by_policy_total{pod=\"$A_POD\",forward=\"api\"} $before -> $after"
  np=$(kc -n hil get networkpolicy "$A_DEV" -o jsonpath='{.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name} {.spec.podSelector.matchLabels} {.spec.ingress[0].from[0].namespaceSelector.matchLabels} {.spec.ingress[0].ports}') || ok=0
  note "NetworkPolicy hil/$A_DEV: owner $np"
  [[ $np == "Device/$A_DEV "* && $np == *team-a* ]] || ok=0
  until_ok 10 a_has refused-by-policy "$A_IP_B" || ok=0
  note "audit, closed, team-a:            $(a_audit | awk -v a="$A_IP_A" '$2 == "closed" && $3 == a' | tail -n 1)"
  note "audit, refused-by-policy, team-b: $(a_audit | awk -v a="$A_IP_B" '$2 == "refused-by-policy" && $3 == a' | tail -n 1)"
  a_audit | awk -v a="$A_IP_A" '$2 == "closed" && $3 == a && $4 == "team-a/client"' | grep -q . || ok=0
  # team-b's pod is nobody the rules know: its address stands for it
  a_audit | awk -v a="$A_IP_B" '$2 == "refused-by-policy" && $3 == a && $4 == a' | grep -q . || ok=0
  ((ok))
}
check "A2 allowedClients [namespaceSelector team-a]: AccessEnforced True; team-a's pod echoed, team-b's reset (edgelink_refused_by_policy_total), NetworkPolicy $A_DEV owned by the Device, audit closed (team-a/client) and refused-by-policy (team-b's address)" a2_policy

# --- A3. leases through Jobs ----------------------------------------------------------------------
# hil-a: a first echo once its address and lease have reached edgelinkd
# (up to 15 s), then echoes for 20 s, each must come back; exit 1 if one
# did not. hil-b: after 3 s (its lease Waiting by then), tries until one
# comes back (120 s at most), printing each attempt.
# shellcheck disable=SC2016  # run by the pod's sh
A3_A='w=0
while [ $w -lt 30 ]; do w=$((w + 1)); [ "$(echo warm-$w | timeout 8 nc -w 3 $SVC 8080)" = warm-$w ] && break; sleep 0.5; done
echo "hil-a: first echo after $w attempts at $(date +%s)"
end=$(($(date +%s) + 20)); i=0; ok=0; bad=0
while [ $(date +%s) -lt $end ]; do
  i=$((i + 1))
  if [ "$(echo a-$i | timeout 8 nc -w 3 $SVC 8080)" = a-$i ]; then ok=$((ok + 1)); else bad=$((bad + 1)); echo "hil-a: echo $i failed at $(date +%s)"; fi
  sleep 0.5
done
echo "hil-a: $ok echoed, $bad failed; done at $(date +%s)"
[ $bad -eq 0 ]'
# shellcheck disable=SC2016
A3_B='sleep 3
start=$(date +%s); n=0
while [ $(($(date +%s) - start)) -lt 120 ]; do
  n=$((n + 1)); t=$(date +%s)
  if [ "$(echo b-$n | timeout 12 nc -w 8 $SVC 8080)" = b-$n ]; then echo "hil-b: attempt $n (begun at $t) echoed at $(date +%s)"; exit 0; fi
  echo "hil-b: attempt $n (begun at $t) failed at $(date +%s)"
  sleep 1
done
echo "hil-b: nothing echoed in 120 s"; exit 1'
a3_job() { # a3_job NAME SCRIPT
  python3 -c '
import json, sys
name, image, node, svc, dev, script = sys.argv[1:]
print(json.dumps({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": "team-a"},
  "spec": {"backoffLimit": 0, "template": {
    "metadata": {"annotations": {"edgelink.io/lease": "hil/" + dev}},
    "spec": {"nodeName": node, "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
      "containers": [{"name": "run", "image": image, "imagePullPolicy": "Never", "env": [{"name": "SVC", "value": svc}],
        "command": ["sh", "-c", script]}]}}}}))' "$1" "$CLIENT_IMAGE" "$CLIENT_NODE" "$A_SVC" "$A_DEV" "$2" | kc apply -f - >/dev/null
}
a3_pod() { kc -n team-a get pods -l "batch.kubernetes.io/job-name=$1" -o jsonpath='{.items[0].metadata.name}'; }
a3_phase() { kc -n team-a get pod "$1" -o jsonpath='{.status.phase}'; }
a3_lease() { kc -n team-a get dls "$1-lease" -o jsonpath='{.status.state}{.status.position}' 2>/dev/null; }
A3_PA='' A3_PB=''
a3_leases() {
  local ok=1 t0 ta tb pa pb ipb ha hb la lb line fin since tally early i
  local before_l before_w before_t before_r
  before_l=$(a_metric edgelink_refused_by_lease_total) before_w=$(a_metric edgelink_lease_waits_total)
  before_t=$(a_metric edgelink_lease_wait_timeouts_total) before_r=$(a_metric edgelink_access_resets_total)
  t0=$(date +%s.%N)
  a3_job hil-a "$A3_A" || return 1
  until_ok 30 differs "" a3_pod hil-a || return 1
  pa=$(a3_pod hil-a) A3_PA=$pa
  until_ok 60 is Held a3_lease "$pa" || { note "hil-a's lease: $(a3_lease "$pa")"; a_dls; return 1; }
  until_ok 20 differs "" kc -n team-a get pod "$pa" -o jsonpath='{.status.podIP}'
  note "hil-a: pod $pa ($(kc -n team-a get pod "$pa" -o jsonpath='{.status.podIP}')), its lease $pa-lease Held after $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s"
  a_dls
  while python3 -c "import sys; sys.exit(0 if $(date +%s.%N) - $t0 < 5 else 1)"; do sleep 0.2; done
  a3_job hil-b "$A3_B" || return 1
  until_ok 30 differs "" a3_pod hil-b || return 1
  pb=$(a3_pod hil-b) A3_PB=$pb
  until_ok 30 is Waiting1 a3_lease "$pb" || ok=0
  note "hil-b: pod $pb created; while hil-a is $(a3_phase "$pa"): hil-a's lease $(a3_lease "$pa"), hil-b's $(a3_lease "$pb") (state and position)"
  [[ $(a3_phase "$pa") == Running && $(a3_lease "$pa") == Held && $(a3_lease "$pb") == Waiting1 ]] || ok=0
  a_dls
  until_ok 10 differs "" kc -n team-a get pod "$pb" -o jsonpath='{.status.podIP}'
  ipb=$(kc -n team-a get pod "$pb" -o jsonpath='{.status.podIP}')
  # hil-a ends: its lease Released, hil-b's Held
  until_ok 90 is Succeeded a3_phase "$pa" || { note "hil-a: $(a3_phase "$pa")"; ok=0; }
  ta=$(date +%s.%N)
  for ((i = 0; i < 100; i++)); do [[ $(a3_lease "$pb") == Held ]] && break; sleep 0.1; done
  tb=$(date +%s.%N)
  la=$(a3_lease "$pa") lb=$(a3_lease "$pb")
  fin=$(kc -n team-a get pod "$pa" -o jsonpath='{.status.containerStatuses[0].state.terminated.finishedAt}')
  since=$(kc -n team-a get dls "$pb-lease" -o jsonpath='{.status.since}')
  note "hil-a Succeeded (seen at +$(python3 -c "print(round($ta - $t0, 1))") s; its container finished at $fin): hil-a's lease $la, hil-b's $lb $(python3 -c "print(round($tb - $ta, 2))") s after the Succeeded was seen (since $since)"
  [[ $la == Released && $lb == Held ]] && python3 -c "import sys; sys.exit(0 if $tb - $ta <= 10 else 1)" || ok=0
  a_dls
  until_ok 150 is 1 kc -n team-a get job hil-b -o jsonpath='{.status.succeeded}' || { note "hil-b: $(kc -n team-a get job hil-b -o jsonpath='{.status.conditions}')"; ok=0; }
  ha=$(kc -n team-a logs "$pa" 2>&1) hb=$(kc -n team-a logs "$pb" 2>&1)
  while IFS= read -r line; do note "| $line"; done <<<"$ha"
  while IFS= read -r line; do note "| $line"; done <<<"$hb"
  local a_done b_echo
  a_done=$(sed -n 's/.* done at \([0-9]*\)$/\1/p' <<<"$ha") b_echo=$(sed -n 's/.* echoed at \([0-9]*\)$/\1/p' <<<"$hb")
  [[ -n $a_done && -n $b_echo ]] && note "hil-b's first echo $((b_echo - a_done)) s after hil-a's last (the pods' clocks, to the second)"
  grep -Eq '^hil-a: [1-9][0-9]* echoed, 0 failed' <<<"$ha" && [[ -n $b_echo ]] || ok=0
  # the leases after both
  until_ok 30 is Released a3_lease "$pb" || ok=0
  a_dls
  # hil-b's audit lines: none reached the device before hil-a ended
  tally=$(a_audit | awk -v a="$ipb" '$3 == a { print $2 }' | sort | uniq -c | awk '{ printf "%s %s, ", $1, $2 }')
  early=$(a_audit | awk -v a="$ipb" -v t="$ta" '$3 == a && $1 < t - 1 { print $2 }' | sort | uniq -c | awk '{ printf "%s %s, ", $1, $2 }')
  note "audit of hil-b's pod ($ipb): ${tally%, }; of those before hil-a ended: ${early%, }"
  note "audit, hil-a's last: $(a_audit | awk -v a="$(kc -n team-a get pod "$pa" -o jsonpath='{.status.podIP}')" '$3 == a' | tail -n 1)"
  note "audit, hil-b's:      $(a_audit | awk -v a="$ipb" '$3 == a' | sed 's/^/[/; s/$/]/' | tr '\n' ' ')"
  [[ $early =~ (refused-by-lease|queue-timeout) && $early != *closed* && $tally == *closed* ]] || ok=0
  a_audit | awk -v a="$ipb" -v l="team-a/$pb-lease" '$2 == "closed" && $3 == a && $5 == l' | grep -q . || ok=0
  note "edgelinkd /metrics (api of $A_POD): $(a_metrics) (before A3: refused_by_lease $before_l, access_resets $before_r, lease_waits $before_w, lease_wait_timeouts $before_t)"
  ((ok))
}
check "A3 leases through Jobs hil-a and hil-b in team-a (edgelink.io/lease: hil/$A_DEV): hil-a Held and hil-b Waiting (position 1) while hil-a echoes (all back); hil-b's attempts meanwhile refused or timed out in the queue, never at the device; hil-a done: Released, hil-b Held within seconds (printed) and echoed" a3_leases

a4_audit() {
  local pod table n rows logs inlog ok=1 line
  pod=$(a_ds_pod)
  [[ -n $pod ]] || { note "no running edgelinkd pod on $NODE"; return 1; }
  n=$(a_audit_raw | grep -c . || true)
  table=$(kc -n edgelink-system exec "$pod" -c edgelinkd -- edgelinkd audit --device "hil/$A_DEV" --since 1h) || return 1
  while IFS= read -r line; do note "| $line"; done <<<"$table"
  rows=$(($(wc -l <<<"$table") - 1))
  note "by client and how it ended: $(a_audit | awk '{ print $4, $2 }' | sort | uniq -c | awk '{ printf "%s %s %s; ", $1, $2, $3 }')"
  note "edgelinkd audit in $pod: $rows rows; /audit: $n lines"
  ((rows >= n && n > 0)) || ok=0
  local want
  for want in "team-a/client .* closed" "$A_IP_B .* refused-by-policy" "team-a/$A3_PA .* closed (lease team-a/$A3_PA-lease)" \
    "team-a/$A3_PB .* \(queue-timeout\|refused-by-lease\)" "team-a/$A3_PB .* closed (lease team-a/$A3_PB-lease)"; do
    grep -q "hil/$A_DEV .*$want" <<<"$table" || { note "no row matching: $want"; ok=0; }
  done
  # the container's log: the same lines, as a log stack ships them
  logs=$(kc -n edgelink-system logs "$pod" -c edgelinkd) || return 1
  inlog=$(grep -F '"kind":"audit"' <<<"$logs" | grep -cF "\"device\":\"hil/$A_DEV\"" || true)
  note "kubectl logs $pod -c edgelinkd: $(grep -cF '"kind":"audit"' <<<"$logs" || true) lines with \"kind\":\"audit\", $inlog of them of hil/$A_DEV; one: $(grep -F "\"device\":\"hil/$A_DEV\"" <<<"$logs" | grep -F '"refused-by-policy"' | tail -n 1)"
  # every /audit line of the Device is in the log, word for word
  local missing
  missing=$(a_audit_raw | python3 -c '
import json, sys
log = set()
for l in sys.argv[1].splitlines():
    try:
        r = json.loads(l)
    except ValueError:
        continue
    if r.get("kind") == "audit":
        log.add(json.dumps(r, sort_keys=True))
print(sum(1 for l in sys.stdin if l.strip() and json.dumps(json.loads(l), sort_keys=True) not in log))' "$(grep -F "\"device\":\"hil/$A_DEV\"" <<<"$logs")")
  note "/audit lines not in the log: $missing"
  ((ok)) && [[ $missing == 0 && $inlog -ge $n ]]
}
check "A4 edgelinkd audit --device hil/$A_DEV --since 1h in the DaemonSet pod on $NODE: a row for each of A1-A3's connections; kubectl logs of edgelinkd has the same lines (\"kind\":\"audit\")" a4_audit

a_gone() { local o; o=$(kc "$@" 2>&1) && return 1; [[ $o == *NotFound* || $o == *"not found"* ]]; }
a_none() { local o; o=$(kc "$@" -o name) && [[ -z $o ]]; } # a_none GET-ARGS...: a list that answered empty
a_since() { python3 -c "import sys; print(round($(date +%s.%N) - float(sys.argv[1]), 1))" "$1"; }
a5_cleanup() {
  local t0 ok=1 left
  note "before: leases in team-a: $(kc -n team-a get dls -o jsonpath='{range .items[*]}{.metadata.name} ({.status.state}, owner {.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}) {end}')"
  t0=$(date +%s.%N)
  kc -n team-a delete job hil-a hil-b --wait=true --timeout 60s >/dev/null || ok=0
  # the pods go (background propagation), and their leases with them
  until_ok 60 a_none -n team-a get pods -l batch.kubernetes.io/job-name || ok=0
  note "Jobs deleted: their pods gone after $(a_since "$t0") s"
  until_ok 60 a_none -n team-a get dls || ok=0
  note "leases left in team-a after $(a_since "$t0") s: [$(kc -n team-a get dls -o name 2>&1 | tr '\n' ' ')]"
  t0=$(date +%s.%N)
  kc -n hil delete device "$A_DEV" >/dev/null || ok=0
  until_ok 60 a_gone -n hil get networkpolicy "$A_DEV" || ok=0
  note "Device deleted: NetworkPolicy hil/$A_DEV gone after $(a_since "$t0") s"
  until_ok 90 a_gone -n hil get statefulset "$A_DEV" || ok=0
  note "its StatefulSet gone after $(a_since "$t0") s"
  t0=$(date +%s.%N)
  # busybox as PID 1 ignores SIGTERM: not the 30 s of grace
  kc -n team-a delete pod client --grace-period=1 --wait=false >/dev/null 2>&1
  kc -n team-b delete pod client --grace-period=1 --wait=false >/dev/null 2>&1
  kc delete namespace team-a team-b --wait=true --timeout 120s >/dev/null || ok=0
  left=$(kc get dls -A -o name 2>&1 | tr '\n' ' ')
  note "namespaces team-a, team-b gone after $(a_since "$t0") s; leases left in the cluster: [${left% }]"
  ((ok)) && [[ -z ${left// /} ]] && a_gone get namespace team-a && a_gone get namespace team-b
}
check "A5 clean-up: Jobs, Device $A_DEV and namespaces team-a, team-b deleted; the leases go with their pods, the NetworkPolicy with its Device" a5_cleanup
