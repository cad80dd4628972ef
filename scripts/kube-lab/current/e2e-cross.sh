# shellcheck shell=bash
# The current profile's own checks (KUBE=1.36, issue 23), after check 10 of
# `make e2e-kube`: sourced by e2e.sh with its helpers (kc, check, note,
# until_ok, client_netns, in_pod_netns, record_of, net1_addr, multus_log,
# STS_POD, SVC_IP, ECHO...). Checks 3a-3d and 10 already cross nodes here
# (the client and the collector run on kw1, the proxy pods on kedge1).
#
#   X1  the client on kw1 reaches device01-01 by the Service's DNS name
#       (CoreDNS): TCP with a SHA-256-checked MiB, HTTP, and UDP to the
#       address the pod's resolver gives.
#   X2  Multus thick: the multus-daemon pod on kedge1 deleted (its
#       DaemonSet starts a new one) under 50 long connections: nothing
#       dropped or refused, the attachment records unchanged; then the new
#       daemon serves a pod deletion and its replacement (DEL and ADD).

DEV_NAME=device01-01.hil.svc.cluster.local
x1_dns() {
  local out l addr udp
  out=$(kc -n hil exec client -- sh -c "head -c 1048576 /dev/urandom >/tmp/n && sha256sum </tmp/n &&
    timeout 20 nc -w 5 $DEV_NAME 8080 </tmp/n >/tmp/nb; wc -c </tmp/nb; sha256sum </tmp/nb;
    printf 'GET / HTTP/1.0\r\nHost: device01-01\r\n\r\n' | timeout 10 nc -w 5 $DEV_NAME 80 | head -n 1;
    nslookup $DEV_NAME | awk '/^Address/ { a = \$NF } END { print a }'") || return 1
  mapfile -t l <<<"$out"
  addr=${l[4]}
  note "TCP by name $DEV_NAME: ${l[1]} bytes back, $([[ ${l[0]%% *} == "${l[2]%% *}" ]] && echo same || echo other) SHA-256; HTTP: ${l[3]%$'\r'}"
  udp=$(in_pod_netns "$(client_netns)" python3 "$ECHO" udp-ping "$addr" 5000 5) || udp="failed: $udp"
  note "the pod's resolver: $DEV_NAME -> $addr (the ClusterIP is $SVC_IP); UDP there: $udp"
  [[ ${l[1]} == 1048576 && ${l[0]%% *} == "${l[2]%% *}" && ${l[3]} == "HTTP/1.1 200"* && $addr == "$SVC_IP" && $udp == ok* ]]
}
check "X1 across nodes by the Service's DNS name (CoreDNS): 1 MiB echoed with the same SHA-256, HTTP 200, UDP to the name's address" x1_dns

multus_pod() {
  kc -n kube-system get pods -l app=multus --field-selector "spec.nodeName=$NODE" -o jsonpath='{.items[0].metadata.name}'
}
multus_ready_on_node() {
  [[ $(kc -n kube-system get pods -l app=multus --field-selector "spec.nodeName=$NODE" \
    -o jsonpath='{.items[0].status.containerStatuses[0].ready}') == true ]]
}
records_digest() { on_node sh -c 'cat /var/lib/edgelink/attachments/*.json 2>/dev/null | sha256sum'; }
x2_multus_restart() {
  local stop=$RUN/e2e-load-x2.stop out=$RUN/logs/e2e-load-x2.out lp old new d0 d1 n0 rec old_cid new_net1 ok=1 i
  CLIENT_NETNS=$(client_netns)
  until_ok 20 tcp_ok || { note "forwards not serving before the restart"; return 1; }
  old=$(multus_pod) d0=$(records_digest) n0=$(net1_addr)
  rm -f "$stop"
  in_pod_netns "$CLIENT_NETNS" python3 "$HERE/longconns.py" "$SVC_IP" 8080 50 "$stop" 150 >"$out" 2>&1 &
  lp=$!
  sleep 3
  kc -n kube-system delete pod "$old" --wait=true --timeout 60s >/dev/null || ok=0
  for ((i = 0; i < 120; i++)); do
    new=$(multus_pod 2>/dev/null || true)
    [[ -n $new && $new != "$old" ]] && multus_ready_on_node && break
    sleep 0.5
  done
  sleep 2
  touch "$stop"
  wait "$lp" || true
  d1=$(records_digest)
  note "multus-daemon on $NODE: $old deleted, $new ready; records $([[ $d0 == "$d1" ]] && echo unchanged || echo CHANGED); $(load_figures "$out")"
  # the new daemon at work: the proxy pod deleted (DEL) and replaced (ADD)
  rec=$(record_of "$STS_POD" | head -n 1)
  old_cid=${rec#* }
  kc -n hil delete pod "$STS_POD" --wait=true --timeout 60s >/dev/null || ok=0
  until_ok 90 kc -n hil wait --for condition=Ready --timeout 2s "pod/$STS_POD" || ok=0
  new_net1=$(net1_addr)
  note "then $STS_POD deleted and replaced through $new: old record $(on_node test -e "${rec%% *}" && echo left || echo gone), net1 $n0 -> $new_net1"
  ((ok)) && [[ -n $new && $new != "$old" && $d0 == "$d1" && $new_net1 == "$n0" ]] &&
    grep -Eq '^long 50: established 50, dropped 0 .*; new: ok [1-9][0-9]*, refused 0, failed 0;' "$out" &&
    ! on_node test -e "${rec%% *}" && [[ -z $(on_node grep -rl "$old_cid" /var/lib/edgelink 2>/dev/null) ]] &&
    until_ok 20 tcp_ok
}
if [[ $MULTUS == thick ]]; then
  check "X2 Multus thick: the multus-daemon on $NODE restarted under 50 long connections (0 dropped, 0 refused, records unchanged); the new one DELs and ADDs the proxy pod" x2_multus_restart
else
  echo "SKIP X2 (MULTUS=thin: no multus-daemon to restart)"
fi
