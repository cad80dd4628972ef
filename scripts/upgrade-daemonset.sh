#!/usr/bin/env bash
# Upgrade edgelinkd without dropping connections where DaemonSets cannot
# surge (Kubernetes 1.20 and 1.21; docs/install.md, "Upgrading edgelinkd
# without dropping connections"). On 1.22 and newer the patch
# daemonset/upgrade/surge.yaml does the same with a plain rolling update.
#
#   scripts/upgrade-daemonset.sh IMAGE            upgrade to IMAGE
#   scripts/upgrade-daemonset.sh --print IMAGE    print the new DaemonSet, change nothing
#
# The DaemonSet is called edgelinkd or edgelinkd-next; this script flips it
# to the other name:
#
#   1. The running DaemonSet's spec, with IMAGE for its two containers,
#      becomes a second DaemonSet under the other name (its own selector
#      label edgelink.io/daemonset=<name>, no hostPort, --takeover and the
#      pod's UID as EDGELINKD_INSTANCE_ID ensured).
#   2. On every node its pod starts beside the old one, and its edgelinkd
#      takes over from the old daemon: listeners, live connections, UDP
#      sessions, the status listener. The old daemon exits 0; its container
#      is restarted and idles (the new daemon does not hand back to it).
#      The script waits until each new pod is ready and its log says
#      "took over" (or, on a node where no old daemon answered, that it
#      started afresh).
#   3. The old DaemonSet is deleted; its pods' idle processes exit 0 on
#      SIGTERM. Nothing is dropped.
#
# If a new pod does not take over in time the script stops before step 3,
# with both DaemonSets there and the old daemons serving where the new ones
# did not take over (docs/install.md says how to go on).
#
# Environment: KUBECTL (default "kubectl"; may be a command with words, e.g.
# "ip netns exec kedge1-node kubectl"), NAMESPACE (edgelink-system),
# TIMEOUT (seconds per step, 180). Needs kubectl and python3.
set -euo pipefail

usage() { sed -n '2,34p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 64; }
say() { echo "upgrade-daemonset: $*"; }
die() { echo "upgrade-daemonset: $*" >&2; exit 1; }

PRINT=
case "${1:-}" in
    --print) PRINT=1; shift ;;
    -h|--help|"") usage ;;
esac
[[ $# == 1 && $1 != -* ]] || usage
IMAGE=$1
read -ra KUBECTL <<<"${KUBECTL:-kubectl}"
NS=${NAMESPACE:-edgelink-system}
TIMEOUT=${TIMEOUT:-180}
NAMES=(edgelinkd edgelinkd-next)
LABEL=edgelink.io/daemonset
command -v python3 >/dev/null || die "python3 is needed"

kc() { "${KUBECTL[@]}" -n "$NS" "$@"; }

# --- which DaemonSet runs now -----------------------------------------------------
have=$(kc get daemonsets -o name) || die "cannot list the DaemonSets of $NS"
exists() { grep -qx "daemonset.apps/$1" <<<"$have"; }
OLD='' NEW=''
if exists "${NAMES[0]}"; then OLD=${NAMES[0]} NEW=${NAMES[1]}; fi
if exists "${NAMES[1]}"; then
    [[ -z $OLD ]] || die "both DaemonSets ${NAMES[0]} and ${NAMES[1]} exist in $NS: an upgrade was interrupted.
  If the newer one's pods took over on every node (their logs say \"took over\"), delete the older one;
  otherwise delete the newer one (its pods' daemons hand nothing back: see docs/install.md)."
    OLD=${NAMES[1]} NEW=${NAMES[0]}
fi
[[ -n $OLD ]] || die "no DaemonSet ${NAMES[0]} or ${NAMES[1]} in $NS (kubectl apply -f daemonset/install.yaml first)"

# --- the new DaemonSet: the old one's spec under the other name -----------------------
new_ds() {
    kc get daemonset "$OLD" -o json | python3 -c '
import json, sys
old, new, image, label = sys.argv[1:5]
ds = json.load(sys.stdin)
meta = ds["metadata"]
ds["metadata"] = {k: meta[k] for k in ("namespace", "labels") if k in meta}
ds["metadata"]["name"] = new
annotations = {k: v for k, v in meta.get("annotations", {}).items()
               if not k.startswith(("kubectl.kubernetes.io/", "deprecated.daemonset.template"))}
if annotations:
    ds["metadata"]["annotations"] = annotations
ds.pop("status", None)
spec = ds["spec"]
spec.pop("templateGeneration", None)
# Its own pods only: the old selector would match the new pods too.
spec["selector"].setdefault("matchLabels", {})[label] = new
tmpl = spec["template"]
tmpl["metadata"].setdefault("labels", {})[label] = new
pod = tmpl["spec"]
names = []
for lst in ("initContainers", "containers"):
    for c in pod.get(lst, []):
        if c["name"] in ("install-cni", "edgelinkd"):
            c["image"] = image
            names.append(c["name"])
        # A hostNetwork port is a hostPort: the new pod would not be
        # scheduled beside the old one.
        if pod.get("hostNetwork") and c.pop("ports", None):
            print("dropped the ports of %s (hostPorts with hostNetwork)" % c["name"], file=sys.stderr)
        if c["name"] != "edgelinkd":
            continue
        args = c.setdefault("args", [])
        if "--takeover" not in args:
            args.append("--takeover")
            print("added --takeover to edgelinkd", file=sys.stderr)
        env = c.setdefault("env", [])
        if not any(e["name"] == "EDGELINKD_INSTANCE_ID" for e in env):
            env.append({"name": "EDGELINKD_INSTANCE_ID",
                        "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.uid"}}})
            print("added EDGELINKD_INSTANCE_ID (the pod UID) to edgelinkd", file=sys.stderr)
if sorted(names) != ["edgelinkd", "install-cni"]:
    sys.exit("DaemonSet %s has no containers install-cni and edgelinkd" % old)
json.dump(ds, sys.stdout, indent=2)
' "$OLD" "$NEW" "$IMAGE" "$LABEL"
}

if [[ -n $PRINT ]]; then
    new_ds
    echo
    exit 0
fi

t0=$(date +%s%N)
ms() { echo $((($(date +%s%N) - t0) / 1000000)); }
# pods NAME: "pod node" of DaemonSet NAME's pods (by owner, not selector)
pods() {
    kc get pods -o json | python3 -c '
import json, sys
for p in json.load(sys.stdin)["items"]:
    if any(o.get("kind") == "DaemonSet" and o.get("name") == sys.argv[1]
           for o in p["metadata"].get("ownerReferences", [])):
        print(p["metadata"]["name"], p["spec"].get("nodeName", "-"), p["metadata"].get("deletionTimestamp", ""))
' "$1"
}

mapfile -t old_pods < <(pods "$OLD")
say "$NS/$OLD -> $NS/$NEW ($IMAGE); $OLD has ${#old_pods[@]} pods"
json=$(new_ds) || die "cannot make $NEW from $OLD"
kc create -f - >/dev/null <<<"$json" || die "kubectl create daemonset $NEW failed"
say "created $NEW ($(ms) ms)"

# --- wait: every node's new daemon took over -----------------------------------------------
kc rollout status "daemonset/$NEW" --timeout "${TIMEOUT}s" >/dev/null ||
    die "$NEW did not roll out within $TIMEOUT s; $OLD left in place (its daemons serve where no new one took over)"
declare -A done_on=()
deadline=$((SECONDS + TIMEOUT))
want=$(kc get daemonset "$NEW" -o jsonpath='{.status.desiredNumberScheduled}')
while ((${#done_on[@]} < want)); do
    ((SECONDS < deadline)) || die "not every $NEW pod took over within $TIMEOUT s (done: ${!done_on[*]}); $OLD left in place"
    while read -r pod node _; do
        [[ -n $pod && -z ${done_on[$node]:-} ]] || continue
        log=$(kc logs "$pod" -c edgelinkd 2>/dev/null || true)
        if [[ $log == *"took over"* ]]; then
            line=$(grep -m 1 -o 'taking over .*' <<<"$log" || true)
            say "$node: $pod took over ($line)"
            done_on[$node]=1
        elif [[ $log == *"starting afresh"* ]]; then
            say "$node: $pod started afresh: no edgelinkd answered there (connections of that node were not carried over)"
            done_on[$node]=1
        fi
    done < <(pods "$NEW")
    ((${#done_on[@]} < want)) && sleep 0.5
done
say "$NEW serves on $want nodes ($(ms) ms)"

# What the old pods did: handed over and exited 0, then (restarted) idle.
for p in "${old_pods[@]}"; do
    read -r pod node _ <<<"$p"
    # the kubelet records the exit and restarts the container within a second or two
    for _ in {1..20}; do
        [[ -n $(kc get pod "$pod" -o jsonpath='{.status.containerStatuses[?(@.name=="edgelinkd")].lastState.terminated.exitCode}' 2>/dev/null) ]] && break
        sleep 0.5
    done
    state=$(kc get pod "$pod" -o jsonpath='{range .status.containerStatuses[?(@.name=="edgelinkd")]}restarts {.restartCount}, last exit {.lastState.terminated.exitCode}{end}' 2>/dev/null || true)
    line=$(kc logs "$pod" -c edgelinkd --previous 2>/dev/null | grep -m 1 -o 'handed over: exiting.*' || true)
    now=$(kc logs "$pod" -c edgelinkd 2>/dev/null | grep -m 1 -o 'idle until stopped' || true)
    say "$node: old pod $pod: ${state:-?}; ${line:-no hand-over line in its previous log (yet)}; now: ${now:-not idle (yet)}"
done

# --- the old DaemonSet goes: its pods' idle processes exit 0 -----------------------------------
kc delete daemonset "$OLD" --wait=true >/dev/null
deadline=$((SECONDS + TIMEOUT))
while left=$(pods "$OLD") && [[ -n $left ]]; do
    ((SECONDS < deadline)) || die "pods of $OLD still there after $TIMEOUT s: $left"
    sleep 0.5
done
say "deleted $OLD and its pods; upgrade done in $(ms) ms: DaemonSet $NEW runs $IMAGE"
