# shellcheck shell=bash
# Check 8c of `make e2e-kube` on the current profile (KUBE=1.36, issue 23):
# the DaemonSet surge path that docs/install.md gives for 1.22 and newer
# (daemonset/upgrade/surge.yaml), run under load on both edge nodes.
# Sourced by e2e.sh after 8b, with its helpers (kc, check, note, until_ok,
# tag_image, client_netns, in_pod_netns, tcp_ok, load_figures, SVC_IP...).
#
# A second proxy of device01-01 on kedge2 (cni-conf/expose-a-device/
# two-edge-nodes/, behind the same Service), so that the 50 long
# connections through the Service are spread over both edge nodes; then the
# patch, then `kubectl set image` to a re-tagged image: on each node the new
# pod starts beside the old one and its edgelinkd takes everything over.
# 0 dropped, 0 refused, 0 failed; each new pod's log says "took over". The
# second proxy is removed afterwards (the checks after this one expect one).

# api_on NODE FIELD: the sum of the api forwards' FIELD (activeConnections,
# totalConnections) in edgelinkd's /status there
api_on() {
  ip netns exec "$(node_ns "$1")" curl -fsS --max-time 5 http://127.0.0.1:9310/status | python3 -c '
import json, sys
print(sum(f.get(sys.argv[1], 0) for a in json.load(sys.stdin)["attachments"]
          for f in a["forwards"] if f["name"] == "api"))' "$2"
}
active_on() { api_on "$1" activeConnections; }
# kedge2_serves: new connections through the Service reach kedge2's proxy
# too (kube-proxy on kw1 has both endpoints: its sync can lag the
# EndpointSlice by seconds)
kedge2_serves() {
  local before
  before=$(api_on kedge2 totalConnections)
  for _ in 1 2 3 4 5 6 7 8; do tcp_ok; done
  (($(api_on kedge2 totalConnections) > before))
}
ds_pod_count() { ds_pods | grep -c .; }
# svc_ready_endpoints: how many ready endpoints the Service device01-01 has
svc_ready_endpoints() {
  kc -n hil get endpointslices -l kubernetes.io/service-name=device01-01 \
    -o jsonpath='{range .items[*].endpoints[?(@.conditions.ready==true)]}{.addresses[0]}{"\n"}{end}' | sort -u | grep -c .
}
# ds_pods: "POD NODE IMAGE" of each edgelinkd pod
ds_pods() {
  kc -n edgelink-system get pods -l app.kubernetes.io/component=node-daemon \
    -o jsonpath='{range .items[*]}{.metadata.name} {.spec.nodeName} {.spec.containers[0].image}{"\n"}{end}'
}
c8c_surge() {
  local tag=edgelink:0.1.0-surge stop=$RUN/e2e-load-c.stop out=$RUN/logs/e2e-load-c.out lp t0 t1 a1 a2 ok=1 p n img took=0 pods log line
  kc apply -f "$REPO/cni-conf/expose-a-device/two-edge-nodes/" >/dev/null || return 1
  kc -n hil rollout status statefulset/device01-01-kedge2 --timeout 120s >/dev/null || { note "no proxy on kedge2"; return 1; }
  until_ok 30 is 2 svc_ready_endpoints ||
    { note "the Service has not both proxies"; return 1; }
  CLIENT_NETNS=$(client_netns)
  until_ok 20 tcp_ok || { note "forwards not serving before the update"; return 1; }
  until_ok 30 kedge2_serves || { note "nothing through the Service reaches kedge2's proxy"; return 1; }
  tag_image edgelink:0.1.0 "$tag" || return 1
  kc -n edgelink-system patch daemonset edgelinkd --patch-file "$REPO/daemonset/upgrade/surge.yaml" >/dev/null || return 1
  note "surge.yaml: $(kc -n edgelink-system get ds edgelinkd -o jsonpath='maxSurge {.spec.updateStrategy.rollingUpdate.maxSurge}, maxUnavailable {.spec.updateStrategy.rollingUpdate.maxUnavailable}, minReadySeconds {.spec.minReadySeconds}')"
  rm -f "$stop"
  in_pod_netns "$CLIENT_NETNS" python3 "$HERE/longconns.py" "$SVC_IP" 8080 50 "$stop" 200 >"$out" 2>&1 &
  lp=$!
  sleep 3
  a1=$(active_on kedge1) a2=$(active_on kedge2)
  note "live connections to the device before the update: kedge1 $a1, kedge2 $a2"
  t0=$(date +%s%N)
  kc -n edgelink-system set image daemonset/edgelinkd "install-cni=$tag" "edgelinkd=$tag" >/dev/null || ok=0
  kc -n edgelink-system rollout status daemonset/edgelinkd --timeout 180s >/dev/null || ok=0
  t1=$(date +%s%N)
  sleep 2
  touch "$stop"
  wait "$lp" || true
  # the old pods go once the new ones are available: until then (their
  # grace period) they are still listed
  until_ok 60 is "${#EDGE_NODES[@]}" ds_pod_count || note "old edgelinkd pods still there: $(ds_pods | tr '\n' ';')"
  pods=$(ds_pods)
  while read -r p n img; do
    [[ -n $p ]] || continue
    # the whole log first: `logs | grep -q` fails under pipefail when grep
    # stops reading early (kubectl gets SIGPIPE)
    log=$(kc -n edgelink-system logs "$p" -c edgelinkd) || log=""
    line=$(grep -m 1 -o 'took over.*' <<<"$log") || line="no take-over"
    [[ $line == "took over"* ]] && took=$((took + 1))
    note "$n: $p runs $img, log: $line"
  done <<<"$pods"
  note "surge rollout to $tag: $(((t1 - t0) / 1000000)) ms; $(tail -n 1 "$out")"
  note "surge (8c): $(load_figures "$out")"
  kc delete -f "$REPO/cni-conf/expose-a-device/two-edge-nodes/" --wait=true --timeout 60s >/dev/null ||
    { note "the second proxy did not go"; ok=0; }
  ((a1 > 0 && a2 > 0)) || { note "the load did not reach both edge nodes"; ok=0; }
  ((took == ${#EDGE_NODES[@]})) || { note "$took of ${#EDGE_NODES[@]} new pods took over"; ok=0; }
  [[ $(grep -c " $tag\$" <<<"$pods") == "${#EDGE_NODES[@]}" && $(wc -l <<<"$pods") == "${#EDGE_NODES[@]}" ]] ||
    { note "edgelinkd pods: $(tr '\n' ';' <<<"$pods")"; ok=0; }
  grep -Eq '^long 50: established 50, dropped 0 .*; new: ok [1-9][0-9]*, refused 0, failed 0;' "$out" || ok=0
  until_ok 20 tcp_ok || { note "the forwards do not answer after"; ok=0; }
  ((ok))
}
check "8c DaemonSet surge (daemonset/upgrade/surge.yaml, then set image) on both edge nodes under 50 long connections through proxies on kedge1 and kedge2: each new pod took over, 0 dropped, 0 refused" c8c_surge
