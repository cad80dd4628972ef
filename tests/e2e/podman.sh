#!/usr/bin/env bash
# End-to-end test of the edgelink CNI plugin driven by podman (CNI backend).
#
#   tests/e2e/podman.sh [options] PLUGIN_BIN
#   tests/e2e/podman.sh --reference [options]
#
# PLUGIN_BIN    the built edgelink plugin (e.g. target/debug/edgelink)
# --reference   use the reference plugins from /usr/lib/cni (bridge or
#               macvlan + host-local) instead of edgelink, to check the
#               harness itself; the edgelink-only checks (attachment records)
#               are skipped
# --trace       wrap every plugin (and IPAM plugin) in a logging shim and print
#               each call podman makes: command, CNI_* environment, stdin,
#               stdout, exit code, parent process
# --only GLOB   run only the cases whose name matches GLOB
#               (cases: podman-{bridge,macvlan}-{1.0.0,0.4.0})
# --keep        keep the test directory (not the netns or containers) on exit
#
# Needs root and: podman, runc, busybox-static, containernetworking-plugins,
# iproute2 (scripts/install-deps.sh test). Everything lives in a mktemp -d
# directory and in two network namespaces created here (elk-e2e-node-PID,
# elk-e2e-dev-PID); podman runs inside the node netns and reads its settings
# from CONTAINERS_CONF / CONTAINERS_STORAGE_CONF only. Nothing in /etc changes
# and no traffic leaves those namespaces.
#
# Prints PASS/FAIL per case and "N passed, M failed" last; exits 1 on any
# failure, 2 on a usage or setup error.
set -euo pipefail

# ---------------------------------------------------------------- settings
readonly SUBNET_PREFIX=172.31.250
readonly DEVICE_IP=172.31.250.10
readonly RANGE_FIRST=100 RANGE_LAST=120
readonly BRIDGE=elkbr0 UPLINK=uplink0
readonly IMAGE=localhost/edgelink-testimg
readonly NODE_NS=elk-e2e-node-$$ DEV_NS=elk-e2e-dev-$$
readonly NET_PREFIX=elke2e$$ # network names: unique in podman's global CNI cache
readonly CNI_CACHE=/var/lib/cni/results
readonly BLOB_CACHE=/var/lib/containers/cache/blob-info-cache-v1.boltdb
readonly PODMAN_TIMEOUT=${E2E_PODMAN_TIMEOUT:-60} # seconds, every podman call
readonly CLEAN_TIMEOUT=${E2E_CLEAN_TIMEOUT:-15}    # seconds to wait for DEL effects

REFERENCE=0 TRACE=0 KEEP=0 ONLY='*' PLUGIN_BIN=''
TESTDIR='' PODMAN_READY=0 BLOB_CACHE_EXISTED=0
[[ ! -e $BLOB_CACHE ]] || BLOB_CACHE_EXISTED=1

usage() {
    sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'
}

die() {
    echo "e2e: $*" >&2
    exit 2
}

log() {
    echo "    $*"
}

now_ms() {
    local t=${EPOCHREALTIME/[.,]/}
    echo $((t / 1000))
}

indent() {
    sed 's/^/      /'
}

while [[ $# -gt 0 ]]; do
    case $1 in
    --reference) REFERENCE=1 ;;
    --trace) TRACE=1 ;;
    --keep) KEEP=1 ;;
    --only)
        [[ $# -ge 2 ]] || die "--only needs a pattern"
        ONLY=$2
        shift
        ;;
    -h | --help)
        usage
        exit 0
        ;;
    -*) die "unknown option $1 (see --help)" ;;
    *)
        [[ -z $PLUGIN_BIN ]] || die "only one PLUGIN_BIN"
        PLUGIN_BIN=$1
        ;;
    esac
    shift
done

if [[ $REFERENCE == 0 ]]; then
    [[ -n $PLUGIN_BIN ]] || die "usage: $0 PLUGIN_BIN | --reference (see --help)"
    [[ -f $PLUGIN_BIN && -x $PLUGIN_BIN ]] || die "$PLUGIN_BIN is not an executable file"
    PLUGIN_BIN=$(realpath "$PLUGIN_BIN")
fi
CASES=()
for mode in bridge macvlan; do
    for ver in 1.0.0 0.4.0; do
        # shellcheck disable=SC2053 # ONLY is a glob on purpose
        [[ podman-$mode-$ver != $ONLY ]] || CASES+=("$mode $ver")
    done
done
[[ ${#CASES[@]} -gt 0 ]] || die "no case matches --only '$ONLY'"
[[ $(id -u) == 0 ]] || die "must run as root"
for cmd in podman runc conmon nsenter setsid ip timeout findmnt; do
    command -v "$cmd" >/dev/null || die "$cmd not found (run scripts/install-deps.sh test)"
done
[[ -x /bin/busybox ]] || die "/bin/busybox not found (busybox-static)"
if [[ $REFERENCE == 1 ]]; then
    for p in bridge macvlan host-local; do
        [[ -x /usr/lib/cni/$p ]] || die "/usr/lib/cni/$p not found (containernetworking-plugins)"
    done
fi

# ---------------------------------------------------------------- cleanup
ensure_node_ns() {
    if [[ ! -e /var/run/netns/$NODE_NS ]]; then
        ip netns add "$NODE_NS"
        ip -n "$NODE_NS" link set lo up
    fi
}

# podman inside the node netns, with the test's configuration only.
# nsenter, not `ip netns exec`: the latter remounts /sys, which breaks runc's
# cgroup handling. setsid: a Ctrl-C must not kill podman (or the plugin it
# runs) half-way through ADD, which would leave a container netns podman never
# recorded; the trap runs once the current podman call has returned (at most
# PODMAN_TIMEOUT). timeout --foreground kills only podman: a plugin still
# running then is found by kill_strays.
pod() {
    setsid -w timeout --foreground -k 5 "$PODMAN_TIMEOUT" \
        nsenter --net="/var/run/netns/$NODE_NS" \
        env CONTAINERS_CONF="$TESTDIR/containers.conf" \
        CONTAINERS_STORAGE_CONF="$TESTDIR/storage.conf" \
        podman "$@"
}

# Processes still in the node netns are ours (podman's cleanup processes, a
# plugin that still runs after its podman timed out). Give them a few seconds,
# then kill them by PID, and delete the container netns such a plugin was
# given (its CNI_NETNS): podman never recorded it, so `podman rm` cannot.
kill_strays() {
    [[ -e /var/run/netns/$NODE_NS ]] || return 0
    local pid ns pids netnses=() deadline=$((SECONDS + 5))
    while :; do
        pids=$(ip netns pids "$NODE_NS" 2>/dev/null || true)
        [[ -n $pids && $SECONDS -lt $deadline ]] || break
        sleep 0.2
    done
    [[ -n $pids ]] || return 0
    for pid in $pids; do
        ns=$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null |
            sed -n 's|^CNI_NETNS=/run/netns/\(netns-[-0-9a-f]*\)$|\1|p') || true
        [[ -z $ns ]] || netnses+=("$ns")
    done
    echo "e2e: killing leftover processes in $NODE_NS: ${pids//$'\n'/ }" >&2
    # shellcheck disable=SC2086 # one PID per word
    kill -KILL $pids 2>/dev/null || true
    for ns in $(printf '%s\n' "${netnses[@]}" | sort -u); do
        if [[ -e /run/netns/$ns ]]; then
            echo "e2e: deleting container netns $ns that podman left" >&2
            ip netns del "$ns" 2>/dev/null || true
        fi
    done
}

topology_down() {
    kill_strays
    ip netns del "$DEV_NS" 2>/dev/null || true
    ip netns del "$NODE_NS" 2>/dev/null || true
}

cleanup() {
    local rc=$?
    trap '' INT TERM
    trap - EXIT
    if [[ $PODMAN_READY == 1 ]]; then
        # Leftover containers get their DEL inside a node netns, never the host's.
        ensure_node_ns 2>/dev/null || true
        local out
        out=$(pod rm -af -t 0 2>&1) || echo "e2e: cleanup: podman rm -af failed: $out" >&2
        out=$(pod system reset --force 2>&1) || echo "e2e: cleanup: podman system reset failed: $out" >&2
    fi
    topology_down
    # podman 4.3 keeps CNI results in a fixed global cache and the image blob
    # cache in a fixed place: remove what this run put there.
    rm -f "$CNI_CACHE/$NET_PREFIX"-* 2>/dev/null || true
    [[ $BLOB_CACHE_EXISTED == 1 ]] || rm -f "$BLOB_CACHE"
    if [[ -n $TESTDIR && -d $TESTDIR ]]; then
        # Never let rm wander into a mount that podman left behind.
        local m
        while read -r m; do
            umount -l "$m" 2>/dev/null || true
        done < <(findmnt -rn -o TARGET | grep -F "$TESTDIR" | sort -r)
        if [[ $KEEP == 1 ]]; then
            echo "e2e: kept $TESTDIR"
        else
            rm -rf --one-file-system "$TESTDIR"
        fi
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---------------------------------------------------------------- test dir
TESTDIR=$(mktemp -d /tmp/elk-e2e.XXXXXX)
mkdir -p "$TESTDIR"/{net.d,bin,state,hostlocal,tmp,trace,graphroot,runroot}

cat >"$TESTDIR/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]
pids_limit = 0

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
runtime = "runc"
tmp_dir = "$TESTDIR/tmp"
image_copy_tmp_dir = "$TESTDIR/tmp"
lock_type = "file"

[network]
network_backend = "cni"
network_config_dir = "$TESTDIR/net.d"
cni_plugin_dirs = ["$TESTDIR/bin", "/usr/lib/cni"]
EOF

cat >"$TESTDIR/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$TESTDIR/graphroot"
runroot = "$TESTDIR/runroot"
EOF

# A logging shim in front of a plugin: records each call under trace/.
write_trace_shim() {
    local shim=$1 real=$2
    cat >"$shim" <<EOF
#!/bin/sh
n=\$(date +%s%N)-\$\$
log="$TESTDIR/trace/\$n.log"
stdin=\$(cat)
{
    echo "plugin=\$(basename "\$0") command=\${CNI_COMMAND:-} pid=\$\$"
    echo "parent: \$(tr '\\0' ' ' </proc/\$PPID/cmdline)"
    echo "netns of plugin: \$(readlink /proc/self/ns/net)"
    echo "env:"
    env | grep -E '^(CNI_|PATH=|CONTAINERS_|HOME=|NETCONFPATH=)' | sort | sed 's/^/  /'
    echo "all env names: \$(env | cut -d= -f1 | sort | tr '\\n' ' ')"
    echo "stdin: \$stdin"
} >"\$log"
out=\$(printf '%s' "\$stdin" | "$real" "\$@")
rc=\$?
printf '%s\n' "\$out"
{
    echo "stdout: \$out"
    echo "rc: \$rc"
} >>"\$log"
exit \$rc
EOF
    chmod 0755 "$shim"
}

if [[ $REFERENCE == 1 ]]; then
    if [[ $TRACE == 1 ]]; then
        for p in bridge macvlan host-local; do
            write_trace_shim "$TESTDIR/bin/$p" "/usr/lib/cni/$p"
        done
    fi
else
    if [[ $TRACE == 1 ]]; then
        cp "$PLUGIN_BIN" "$TESTDIR/bin/edgelink.real"
        write_trace_shim "$TESTDIR/bin/edgelink" "$TESTDIR/bin/edgelink.real"
    else
        cp "$PLUGIN_BIN" "$TESTDIR/bin/edgelink"
    fi
fi

# ---------------------------------------------------------------- topology
# node netns: lo, uplink0 (veth) ; device netns: dev0 = 172.31.250.10/24
topology_up() {
    topology_down
    ip netns add "$NODE_NS"
    ip netns add "$DEV_NS"
    ip -n "$NODE_NS" link set lo up
    ip -n "$DEV_NS" link set lo up
    ip -n "$NODE_NS" link add "$UPLINK" type veth peer name dev0 netns "$DEV_NS"
    ip -n "$DEV_NS" addr add "$DEVICE_IP/24" dev dev0
    ip -n "$DEV_NS" link set dev0 up
    ip -n "$NODE_NS" link set "$UPLINK" up
}

node_links() {
    # stderr: a host veth whose peer netns is being torn down makes ip say
    # "Peer netns reference is invalid".
    ip -n "$NODE_NS" -o link show 2>/dev/null | awk -F': ' '{ sub(/@.*/, "", $2); print $2 }' | sort
}

# ---------------------------------------------------------------- image
build_image() {
    local root=$TESTDIR/rootfs applet
    mkdir -p "$root"/{bin,dev,etc,proc,sys,tmp,run}
    cp /bin/busybox "$root/bin/busybox"
    for applet in $(/bin/busybox --list); do
        [[ $applet == busybox ]] || ln -sf busybox "$root/bin/$applet"
    done
    tar -C "$root" -cf "$TESTDIR/rootfs.tar" .
    local out
    if ! out=$(pod import --change 'CMD ["/bin/sh"]' "$TESTDIR/rootfs.tar" "$IMAGE" 2>&1); then
        echo "$out" >&2
        die "podman import failed"
    fi
    rm -rf "$root" "$TESTDIR/rootfs.tar"
}

# ---------------------------------------------------------------- config
# write_conflist MODE VERSION NETNAME -> path
write_conflist() {
    local mode=$1 ver=$2 net=$3 ipam iface plugin
    local range='"ranges": [[{"subnet": "'$SUBNET_PREFIX'.0/24", "rangeStart": "'$SUBNET_PREFIX.$RANGE_FIRST'", "rangeEnd": "'$SUBNET_PREFIX.$RANGE_LAST'", "gateway": "'$SUBNET_PREFIX'.1"}]], "routes": [{"dst": "172.31.0.0/16"}]'
    if [[ $REFERENCE == 1 ]]; then
        ipam='{"type": "host-local", '$range', "dataDir": "'$TESTDIR/hostlocal'"}'
        if [[ $mode == bridge ]]; then
            plugin='{"type": "bridge", "bridge": "'$BRIDGE'", "isGateway": false, "ipMasq": false, "ipam": '$ipam'}'
        else
            plugin='{"type": "macvlan", "master": "'$UPLINK'", "mode": "bridge", "ipam": '$ipam'}'
        fi
    else
        ipam='{'$range', "nodeName": "node1"}'
        if [[ $mode == bridge ]]; then
            iface='"mode": "bridge", "bridge": "'$BRIDGE'", "uplink": "'$UPLINK'"'
        else
            iface='"mode": "macvlan", "uplink": "'$UPLINK'"'
        fi
        plugin='{"type": "edgelink", '$iface', "stateDir": "'$TESTDIR/state'", "ipam": '$ipam', "forwards": [{"name": "api", "protocol": "tcp", "port": 8080, "target": "'$DEVICE_IP':8080"}]}'
    fi
    local file=$TESTDIR/net.d/$net.conflist
    printf '{"cniVersion": "%s", "name": "%s", "plugins": [%s]}\n' "$ver" "$net" "$plugin" >"$file"
    echo "$file"
}

# ---------------------------------------------------------------- checks
status_text() {
    if [[ $1 == 124 || $1 == 137 ]]; then
        echo "timed out after ${PODMAN_TIMEOUT} s"
    else
        echo "exit status $1"
    fi
}

CASE_FAILS=0
fail() {
    echo "    FAIL: $*"
    CASE_FAILS=$((CASE_FAILS + 1))
}
ok() {
    echo "    ok: $*"
}

ip_in_range() { # 172.31.250.N/24
    local cidr=$1 addr prefix last
    addr=${cidr%/*} prefix=${cidr#*/}
    [[ $prefix == 24 && $addr == "$SUBNET_PREFIX".* ]] || return 1
    last=${addr##*.}
    [[ $last =~ ^[0-9]+$ ]] && ((last >= RANGE_FIRST && last <= RANGE_LAST))
}

is_ip_name() {
    [[ $1 =~ ^([0-9]{1,3}\.){3}[0-9]{1,3}$ || ($1 == *:* && $1 =~ ^[0-9a-fA-F:.]+$) ]]
}

ipam_dir() { # NETNAME
    if [[ $REFERENCE == 1 ]]; then
        echo "$TESTDIR/hostlocal/$1"
    else
        echo "$TESTDIR/state/ipam/$1"
    fi
}

ip_files() { # NETNAME -> reserved addresses, one per line
    local dir f
    dir=$(ipam_dir "$1")
    [[ -d $dir ]] || return 0
    while IFS= read -r f; do
        f=${f##*/}
        if is_ip_name "$f"; then echo "$f"; fi
    done < <(find "$dir" -type f)
}

attachment_files() {
    [[ -d $TESTDIR/state/attachments ]] || return 0
    find "$TESTDIR/state/attachments" -type f | sort
}

# Files under attachments/ that name the container (in the path or content).
records_of() { # CID
    local f
    while IFS= read -r f; do
        if [[ $f == *"$1"* ]] || grep -qF -- "$1" "$f" 2>/dev/null; then echo "$f"; fi
    done < <(attachment_files)
}

# Prints what is still left after a container is gone; empty = clean.
leftovers() { # MODE NETNAME CID SANDBOX
    local mode=$1 net=$2 cid=$3 sandbox=$4 allowed links extra
    allowed=$(printf '%s\n' lo "$UPLINK" | sort)
    [[ $mode != bridge ]] || allowed=$(printf '%s\n' lo "$UPLINK" "$BRIDGE" | sort)
    links=$(node_links)
    extra=$(comm -13 <(echo "$allowed") <(echo "$links") | tr '\n' ' ')
    [[ -z $extra ]] || echo "links left in the node netns: $extra"
    grep -qx "$UPLINK" <<<"$links" || echo "$UPLINK is gone from the node netns"
    local ips
    ips=$(ip_files "$net" | tr '\n' ' ')
    [[ -z $ips ]] || echo "IPAM reservations left in $(ipam_dir "$net"): $ips"
    if [[ $REFERENCE == 0 && -n $cid ]]; then
        local recs
        recs=$(records_of "$cid" | tr '\n' ' ')
        [[ -z $recs ]] || echo "attachment records left: $recs"
    fi
    if [[ -n $sandbox && -e $sandbox ]]; then echo "container netns $sandbox still exists"; fi
    # libcni drops its cached result only when DEL succeeded.
    if [[ -n $cid && -e $CNI_CACHE/$net-$cid-eth0 ]]; then echo "podman's CNI cache still holds $CNI_CACHE/$net-$cid-eth0"; fi
    return 0
}

# Waits (bounded) until nothing is left; reports what is.
expect_clean() { # MODE NETNAME CID SANDBOX WHAT
    local deadline=$((SECONDS + CLEAN_TIMEOUT)) left
    while :; do
        left=$(leftovers "$1" "$2" "$3" "$4")
        [[ -n $left && $SECONDS -lt $deadline ]] || break
        sleep 0.2
    done
    if [[ -z $left ]]; then
        ok "$5: no link, reservation, record or netns left"
    else
        while IFS= read -r l; do fail "$5: $l"; done <<<"$left"
    fi
}

print_trace() {
    local f
    shopt -s nullglob
    local files=("$TESTDIR"/trace/*.log)
    shopt -u nullglob
    [[ ${#files[@]} -gt 0 ]] || return 0
    echo "    --- plugin calls (oldest first) ---"
    for f in "${files[@]}"; do
        sed 's/^/    | /' "$f"
        echo "    |"
    done
    mkdir -p "$TESTDIR/trace/done"
    mv "${files[@]}" "$TESTDIR/trace/done/"
}

# ---------------------------------------------------------------- one case
run_case() { # MODE VERSION
    local mode=$1 ver=$2 net out cid sandbox addr links_before
    net=$NET_PREFIX-$mode-${ver//./}
    CASE_FAILS=0

    topology_up
    if [[ $REFERENCE == 1 && $mode == bridge ]]; then
        # The reference bridge plugin does not enslave an uplink; edgelink does.
        ip -n "$NODE_NS" link add "$BRIDGE" type bridge
        ip -n "$NODE_NS" link set "$UPLINK" master "$BRIDGE"
        ip -n "$NODE_NS" link set "$BRIDGE" up
    fi
    write_conflist "$mode" "$ver" "$net" >/dev/null

    local inspect
    if inspect=$(pod network inspect "$net" 2>&1); then
        ok "podman sees network $net"
    else
        # podman drops a network whose plugins fail VERSION or do not list
        # the conflist's cniVersion. Show what the plugin says.
        fail "podman does not see network $net:"
        indent <<<"$inspect"
        echo "    the plugin's VERSION answer:"
        local plugin=$TESTDIR/bin/edgelink
        [[ $REFERENCE == 0 ]] || plugin=/usr/lib/cni/$mode
        local vout vrc=0
        vout=$(nsenter --net="/var/run/netns/$NODE_NS" env -i CNI_COMMAND=VERSION \
            timeout 10 "$plugin" <<<"{\"cniVersion\": \"$ver\"}" 2>&1) || vrc=$?
        indent <<<"${vout:-(no output)}"
        echo "      (exit status $vrc)"
        return
    fi

    # 1. Foreground run, removed on exit: the brief's one-liner.
    local t0
    t0=$(now_ms)
    local cidfile=$TESTDIR/tmp/$net.cid
    rm -f "$cidfile"
    local prc=0
    out=$(pod run --rm --cidfile "$cidfile" --network "$net" "$IMAGE" \
        sh -c "ip -4 -o addr show dev eth0; ping -c1 -W2 $DEVICE_IP" 2>&1) || prc=$?
    if [[ $prc == 0 ]]; then
        addr=$(awk '$2 == "eth0" && $3 == "inet" { print $4; exit }' <<<"$out")
        if ip_in_range "$addr"; then ok "run --rm: eth0 has $addr"; else fail "run --rm: eth0 address '$addr' not in range"; fi
        if grep -q ' 0% packet loss' <<<"$out"; then ok "run --rm: ping $DEVICE_IP"; else fail "run --rm: ping $DEVICE_IP"; fi
    else
        fail "podman run --rm failed ($(status_text $prc)):"
        indent <<<"$out"
    fi
    log "run --rm took $(($(now_ms) - t0)) ms"
    cid=$(cat "$cidfile" 2>/dev/null || true)
    expect_clean "$mode" "$net" "$cid" "" "after run --rm"

    # 2. Detached container: inspect it while it runs, then remove it.
    local records_before
    records_before=$(attachment_files)
    links_before=$(node_links)
    t0=$(now_ms)
    prc=0
    cid=$(pod run -d --network "$net" "$IMAGE" sleep 300 2>&1) || prc=$?
    if [[ $prc != 0 ]]; then
        fail "podman run -d failed ($(status_text $prc)):"
        indent <<<"$cid"
        return
    fi
    cid=$(tail -n1 <<<"$cid")
    log "run -d took $(($(now_ms) - t0)) ms"
    sandbox=$(pod inspect -f '{{.NetworkSettings.SandboxKey}}' "$cid" 2>/dev/null || true)
    log "container ${cid:0:12}, netns $sandbox"

    addr=$(pod exec "$cid" ip -4 -o addr show dev eth0 2>&1 | awk '$3 == "inet" { print $4; exit }') || true
    if ip_in_range "$addr"; then ok "eth0 has $addr"; else fail "eth0 address '$addr' not in range"; fi
    if pod exec "$cid" ping -c1 -W2 "$DEVICE_IP" >/dev/null 2>&1; then
        ok "ping $DEVICE_IP from the container"
    else
        fail "ping $DEVICE_IP from the container"
    fi

    local ips
    ips=$(ip_files "$net")
    if [[ -n $addr ]] && grep -qxF "${addr%/*}" <<<"$ips"; then
        ok "IPAM store holds ${addr%/*}"
    else
        fail "IPAM store $(ipam_dir "$net") does not hold '${addr%/*}' (has: $(echo "$ips" | tr '\n' ' '))"
    fi

    if [[ $REFERENCE == 0 ]]; then
        local new recs
        new=$(comm -13 <(echo "$records_before") <(attachment_files) | tr '\n' ' ')
        recs=$(records_of "$cid" | tr '\n' ' ')
        if [[ -n $new ]]; then ok "attachment record(s) appeared: ${new//$TESTDIR\//}"; else fail "no attachment record appeared under state/attachments"; fi
        [[ -n $recs ]] || fail "no attachment record names container ${cid:0:12}"
    fi

    local extra
    extra=$(comm -13 <(echo "$links_before") <(node_links) | tr '\n' ' ')
    if [[ $mode == bridge ]]; then
        if [[ -n $extra ]]; then ok "host-side link(s) in the node netns: $extra"; else fail "no host-side link appeared in the node netns"; fi
    else
        [[ -z $extra ]] || fail "macvlan mode created links in the node netns: $extra"
    fi

    t0=$(now_ms)
    if pod rm -f -t 0 "$cid" >/dev/null 2>&1; then ok "podman rm -f"; else fail "podman rm -f $cid"; fi
    log "rm -f took $(($(now_ms) - t0)) ms"
    expect_clean "$mode" "$net" "$cid" "$sandbox" "after rm -f"
}

# ---------------------------------------------------------------- main
ensure_node_ns
PODMAN_READY=1
t_setup=$(now_ms)
build_image
echo "e2e: test dir $TESTDIR, image built in $(($(now_ms) - t_setup)) ms"
if [[ $REFERENCE == 1 ]]; then
    echo "e2e: reference plugins (/usr/lib/cni bridge, macvlan, host-local)"
else
    echo "e2e: plugin $PLUGIN_BIN"
fi

PASSED=0 FAILED=0
for c in "${CASES[@]}"; do
    read -r mode ver <<<"$c"
    name=podman-$mode-$ver
    echo "--- $name"
    t_case=$(now_ms)
    set +e
    (
        set -e
        trap 'exit 130' INT
        trap 'exit 143' TERM
        # set -e ended the case: say where.
        trap 'rc=$?; [[ $rc == 0 || $CASE_FAILS != 0 ]] || echo "    FAIL: aborted (status $rc) at: $BASH_COMMAND"' EXIT
        run_case "$mode" "$ver"
        exit $((CASE_FAILS > 0))
    )
    rc=$?
    set -e
    [[ $TRACE == 0 ]] || print_trace
    # Whatever the case left (a failed rm, say): remove it before the next.
    pod rm -af -t 0 >/dev/null 2>&1 || true
    rm -f "$TESTDIR"/net.d/*
    topology_down
    if [[ $rc == 0 ]]; then
        echo "PASS $name ($(($(now_ms) - t_case)) ms)"
        PASSED=$((PASSED + 1))
    else
        echo "FAIL $name ($(($(now_ms) - t_case)) ms)"
        FAILED=$((FAILED + 1))
    fi
done

echo "$PASSED passed, $FAILED failed"
[[ $FAILED == 0 ]]
