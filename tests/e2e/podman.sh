#!/usr/bin/env bash
# End-to-end test of the edgelink CNI plugin driven by podman (CNI backend).
#
#   tests/e2e/podman.sh [options] PLUGIN_BIN
#   tests/e2e/podman.sh --reference [options]
#
# PLUGIN_BIN    the built edgelink plugin (e.g. target/debug/edgelink); the
#               node daemon edgelinkd is taken from beside it, or from
#               $EDGELINKD_BIN
# --reference   use the reference plugins from /usr/lib/cni (bridge or
#               macvlan + host-local) instead of edgelink, to check the
#               harness itself; the edgelink-only checks (attachment records,
#               the daemon) are skipped
# --trace       wrap every plugin (and IPAM plugin) in a logging shim and print
#               each call podman makes: command, CNI_* environment, stdin,
#               stdout, exit code, parent process
# --only GLOB   run only the cases whose name matches GLOB
#               (cases: podman-{bridge,macvlan}-{1.0.0,0.4.0})
# --keep        keep the test directory (not the netns or containers) on exit
#
# Needs root and: podman, runc, busybox-static, containernetworking-plugins,
# iproute2, python3 (scripts/install-deps.sh test). Everything lives in a
# mktemp -d directory and in two network namespaces created here
# (elk-e2e-node-PID, elk-e2e-dev-PID); podman runs inside the node netns and
# reads its settings from CONTAINERS_CONF / CONTAINERS_STORAGE_CONF only.
# Nothing in /etc changes and no traffic leaves those namespaces.
#
# With edgelink, each case also runs the node daemon edgelinkd inside the
# node netns, on the test's state directory (status on 127.0.0.1:9310 of that
# netns), and a TCP and a UDP echo on the device: a container attached by
# podman gets both relayed to the device through its forwards; the plugin's
# CHECK passes while the daemon serves them and fails while it is stopped;
# podman's DEL hands the pod's interface to the daemon, which deletes it
# (retiredLinksDeletedTotal in its /status). The daemon is stopped at the end
# of every case and on any exit.
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

REFERENCE=0 TRACE=0 KEEP=0 ONLY='*' PLUGIN_BIN='' DAEMON_BIN=''
TESTDIR='' PODMAN_READY=0 BLOB_CACHE_EXISTED=0
[[ ! -e $BLOB_CACHE ]] || BLOB_CACHE_EXISTED=1

usage() {
    sed -n '2,38p' "$0" | sed 's/^# \{0,1\}//'
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
    DAEMON_BIN=${EDGELINKD_BIN:-$(dirname "$PLUGIN_BIN")/edgelinkd}
    [[ -f $DAEMON_BIN && -x $DAEMON_BIN ]] || die "$DAEMON_BIN is not an executable file (build edgelinkd, or set EDGELINKD_BIN)"
    DAEMON_BIN=$(realpath "$DAEMON_BIN")
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
for cmd in podman runc conmon nsenter setsid ip timeout findmnt python3; do
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

# The PID in the test dir's pid file NAME, if that process still runs in
# netns NS (a case runs in a subshell: the parent knows its processes by
# these files; the netns check guards against a reused PID).
ours() { # NAME NS
    local pid
    [[ -n $TESTDIR && -f $TESTDIR/$1.pid ]] || return 1
    pid=$(cat "$TESTDIR/$1.pid")
    rm -f "$TESTDIR/$1.pid"
    [[ $pid =~ ^[0-9]+$ && $(ip netns identify "$pid" 2>/dev/null) == "$2" ]] || return 1
    echo "$pid"
}

# The node daemon (edgelinkd), started by start_daemon: SIGTERM, then SIGKILL
# after a bounded wait. Safe to call at any time, from the traps too.
stop_daemon() {
    local pid deadline=$((SECONDS + 10))
    pid=$(ours daemon "$NODE_NS") || return 0
    kill -TERM "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null && [[ $SECONDS -lt $deadline ]]; do sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
        echo "e2e: edgelinkd ($pid) did not stop within 10 s of SIGTERM: killing it" >&2
        kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
}

# The device's TCP and UDP echo (start_device_servers).
stop_device_servers() {
    local pid
    pid=$(ours device "$DEV_NS") || return 0
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

topology_down() {
    stop_daemon
    stop_device_servers
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
# The node decides the plugin's state directory (podman passes its own
# environment to the plugins it runs) and, in its policy there, the uplink
# and the bridge a config may name: the reference bridge plugin may have
# made $BRIDGE first (docs/configuration.md, "The node decides").
export EDGELINK_STATE_DIR="$TESTDIR/state"
printf '{"uplinks": ["%s"], "bridges": ["%s"]}\n' "$UPLINK" "$BRIDGE" >"$TESTDIR/state/node-policy.json"

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
    cp "$PLUGIN_BIN" "$TESTDIR/bin/edgelink.real"
    inner=$TESTDIR/bin/edgelink.real
    if [[ $TRACE == 1 ]]; then
        write_trace_shim "$TESTDIR/bin/edgelink.traced" "$inner"
        inner=$TESTDIR/bin/edgelink.traced
    fi
    # The state directory as the node sets it, in every call: podman runs
    # the DEL of `run --rm` and `rm -f` from `podman container cleanup`,
    # which conmon starts without podman's environment (docs/
    # configuration.md, "The node decides").
    printf '#!/bin/sh\nEDGELINK_STATE_DIR=%q exec %q "$@"\n' "$TESTDIR/state" "$inner" >"$TESTDIR/bin/edgelink"
    chmod 0755 "$TESTDIR/bin/edgelink"
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

# ---------------------------------------------------------------- the daemon and the device
readonly TCP_PORT=8080 UDP_PORT=5000 STATUS_ADDR=127.0.0.1:9310

# A TCP echo (each connection echoed until its end of file, then closed) and
# a UDP echo, on the device's address. Prints "ready" once both are bound.
readonly DEVICE_SERVERS='
import socket, sys, threading
host, tport, uport = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def echo(c):
    with c:
        c.settimeout(30)
        while True:
            d = c.recv(65536)
            if not d:
                break
            c.sendall(d)
        c.shutdown(socket.SHUT_WR)
t = socket.socket()
t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t.bind((host, tport))
t.listen(16)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.bind((host, uport))
def tcp():
    while True:
        c, _ = t.accept()
        threading.Thread(target=echo, args=(c,), daemon=True).start()
threading.Thread(target=tcp, daemon=True).start()
print("ready", flush=True)
while True:
    d, a = u.recvfrom(65536)
    u.sendto(d, a)
'

# A client inside a container netns, to 127.0.0.1 (the daemon's listeners
# there; the container's eth0 is the private side, which the daemon
# refuses): prints what came back. tcp: send, shut down the write side, read
# to the end. udp: send, wait 1 s for the echo, up to 5 tries.
readonly CLIENT='
import socket, sys
kind, port, msg = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode()
if kind == "tcp":
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(msg)
    s.shutdown(socket.SHUT_WR)
    got = b""
    while True:
        d = s.recv(65536)
        if not d:
            break
        got += d
    print(got.decode(errors="replace"))
else:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(1)
    for _ in range(5):
        s.sendto(msg, ("127.0.0.1", port))
        try:
            print(s.recv(65536).decode(errors="replace"))
            break
        except socket.timeout:
            pass
    else:
        sys.exit("no UDP echo")
'

start_device_servers() {
    local log=$TESTDIR/device-servers.log deadline=$((SECONDS + 10))
    ip netns exec "$DEV_NS" python3 -c "$DEVICE_SERVERS" "$DEVICE_IP" "$TCP_PORT" "$UDP_PORT" >"$log" 2>&1 &
    echo $! >"$TESTDIR/device.pid"
    until grep -qx ready "$log" 2>/dev/null; do
        if ! kill -0 "$(cat "$TESTDIR/device.pid")" 2>/dev/null || [[ $SECONDS -ge $deadline ]]; then
            cat "$log" >&2
            die "the device's echo servers did not start"
        fi
        sleep 0.1
    done
}

# edgelinkd in the node netns, on the test's state directory; returns once
# its control socket exists. Its log: edgelinkd-CASE-N.log in the test dir.
DAEMON_STARTS=0
start_daemon() { # CASE
    local sock=$TESTDIR/state/edgelinkd.sock deadline=$((SECONDS + 15))
    DAEMON_STARTS=$((DAEMON_STARTS + 1))
    DAEMON_LOG=$TESTDIR/edgelinkd-$1-$DAEMON_STARTS.log
    rm -f "$sock"
    nsenter --net="/var/run/netns/$NODE_NS" "$DAEMON_BIN" run --state-dir "$TESTDIR/state" \
        --status-addr "$STATUS_ADDR" --probe-interval 0 --grace-period 1 --log-level debug \
        </dev/null >"$DAEMON_LOG" 2>&1 &
    echo $! >"$TESTDIR/daemon.pid"
    until [[ -S $sock ]]; do
        if ! kill -0 "$(cat "$TESTDIR/daemon.pid")" 2>/dev/null || [[ $SECONDS -ge $deadline ]]; then
            fail "edgelinkd did not start:"
            indent <"$DAEMON_LOG"
            stop_daemon
            return 1
        fi
        sleep 0.1
    done
}

# The daemon's /status as JSON (edgelinkd status --json, in the node netns).
daemon_status() {
    nsenter --net="/var/run/netns/$NODE_NS" timeout 10 "$DAEMON_BIN" status --status-addr "$STATUS_ADDR" --json
}

# A figure of the daemon's /status: python3 expression over `s` (the JSON)
# and `cid` (the container ID). Prints it; fails if the status is unreadable.
status_of() { # CID EXPR
    local json
    json=$(daemon_status 2>&1) || {
        echo "status unreadable: $json"
        return 1
    }
    python3 -c '
import json, sys
s = json.loads(sys.stdin.read())
cid = sys.argv[1]
att = [a for a in s["attachments"] if a["containerId"] == cid]
fwd = {f["name"]: f for a in att for f in a["forwards"]}
print(eval(sys.argv[2]))
' "$1" "$2" <<<"$json"
}

# Waits (bounded) until status_of CID EXPR prints True.
wait_status() { # CID EXPR TIMEOUT
    local deadline=$((SECONDS + $3))
    while :; do
        [[ $(status_of "$1" "$2" 2>/dev/null) == True ]] && return 0
        [[ $SECONDS -lt $deadline ]] || return 1
        sleep 0.2
    done
}

# The plugin's CHECK for a running container, as a runtime would send it:
# the network's config (from the conflist), prevResult from podman's CNI
# cache. podman itself never sends CHECK.
plugin_check() { # NETNAME CID SANDBOX -> exit status of the plugin; output on stdout
    local conf
    conf=$(python3 -c '
import json, sys
conflist = json.load(open(sys.argv[1]))
cache = json.load(open(sys.argv[2]))
conf = dict(conflist["plugins"][0], name=conflist["name"], cniVersion=conflist["cniVersion"])
conf["prevResult"] = cache["result"]
print(json.dumps(conf))
' "$TESTDIR/net.d/$1.conflist" "$CNI_CACHE/$1-$2-eth0") || return 2
    nsenter --net="/var/run/netns/$NODE_NS" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
        EDGELINK_STATE_DIR="$EDGELINK_STATE_DIR" CNI_COMMAND=CHECK CNI_CONTAINERID="$2" CNI_NETNS="$3" CNI_IFNAME=eth0 \
        CNI_PATH="$TESTDIR/bin:/usr/lib/cni" timeout 20 "$TESTDIR/bin/edgelink" <<<"$conf" 2>&1
}

# Through the daemon: TCP and UDP from inside the container to the device.
check_relay() { # CID SANDBOX
    local cid=$1 sandbox=$2 got msg
    msg="tcp-through-edgelinkd-$RANDOM"
    got=$(nsenter --net="$sandbox" timeout 20 python3 -c "$CLIENT" tcp "$TCP_PORT" "$msg" 2>&1) || true
    if [[ $got == "$msg" ]]; then ok "TCP relayed to the device and back ($TCP_PORT -> $DEVICE_IP:$TCP_PORT)"; else fail "TCP through the daemon: sent '$msg', got '$got'"; fi
    msg="udp-through-edgelinkd-$RANDOM"
    got=$(nsenter --net="$sandbox" timeout 20 python3 -c "$CLIENT" udp "$UDP_PORT" "$msg" 2>&1) || true
    if [[ $got == "$msg" ]]; then ok "UDP relayed to the device and back ($UDP_PORT -> $DEVICE_IP:$UDP_PORT)"; else fail "UDP through the daemon: sent '$msg', got '$got'"; fi
    if wait_status "$cid" 'fwd["api"]["totalConnections"] >= 1 and fwd["telemetry"]["udpDatagramsToTarget"] >= 1 and fwd["telemetry"]["udpDatagramsToClient"] >= 1' 10; then
        ok "the daemon counted them (api totalConnections, telemetry udpDatagramsTo{Target,Client})"
    else
        fail "the daemon's counters did not move: $(status_of "$cid" 'fwd' 2>&1)"
    fi
}

daemon_log_tail() {
    [[ -n ${DAEMON_LOG:-} && -f $DAEMON_LOG ]] || return 0
    echo "    --- edgelinkd log (last lines) ---"
    tail -n 30 "$DAEMON_LOG" | indent
}

# Waits (bounded) until the daemon serves container CID with both forwards.
wait_serving() { # CID WHAT
    if wait_status "$1" 'len(att) == 1 and len(fwd) == 2 and all(f["listener"] == "listening" for f in fwd.values())' 15; then
        ok "$2: edgelinkd serves the container's forwards api and telemetry"
    else
        fail "$2: edgelinkd does not serve the container's forwards: $(status_of "$1" 'att' 2>&1)"
        daemon_log_tail
        return 1
    fi
}

# What the daemon does for a running container: relay, CHECK, restart.
daemon_checks() { # NETNAME CID SANDBOX CASE
    local net=$1 cid=$2 sandbox=$3 out rc
    wait_serving "$cid" "after run -d" || return 0
    check_relay "$cid" "$sandbox"

    rc=0
    out=$(plugin_check "$net" "$cid" "$sandbox") || rc=$?
    if [[ $rc == 0 ]]; then ok "CHECK passes while edgelinkd serves the forwards"; else
        fail "CHECK failed (exit $rc) while edgelinkd serves:"
        indent <<<"$out"
    fi
    # CHECK asks the daemon: without it, the same CHECK fails.
    stop_daemon
    rc=0
    out=$(plugin_check "$net" "$cid" "$sandbox") || rc=$?
    if [[ $rc != 0 ]] && grep -q 'edgelinkd is not running' <<<"$out"; then
        ok "CHECK fails while edgelinkd is stopped (exit $rc: the daemon is not running)"
    else
        fail "CHECK with edgelinkd stopped: exit $rc, expected a failure naming the daemon:"
        indent <<<"$out"
    fi
    start_daemon "$4" || return 0
    wait_serving "$cid" "edgelinkd restarted" || return 0
    rc=0
    out=$(plugin_check "$net" "$cid" "$sandbox") || rc=$?
    if [[ $rc == 0 ]]; then ok "CHECK passes again"; else
        fail "CHECK failed (exit $rc) after edgelinkd restarted:"
        indent <<<"$out"
    fi
    check_relay "$cid" "$sandbox"
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
        plugin='{"type": "edgelink", '$iface', "stateDir": "'$TESTDIR/state'", "ipam": '$ipam', "forwards": [{"name": "api", "protocol": "tcp", "port": '$TCP_PORT', "target": "'$DEVICE_IP:$TCP_PORT'"}, {"name": "telemetry", "protocol": "udp", "port": '$UDP_PORT', "target": "'$DEVICE_IP:$UDP_PORT'"}]}'
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
    if [[ $REFERENCE == 0 ]]; then
        start_device_servers
        start_daemon "$mode-$ver" || return 0
    fi

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
        daemon_checks "$net" "$cid" "$sandbox" "$mode-$ver"
    fi

    local extra
    extra=$(comm -13 <(echo "$links_before") <(node_links) | tr '\n' ' ')
    if [[ $mode == bridge ]]; then
        if [[ -n $extra ]]; then ok "host-side link(s) in the node netns: $extra"; else fail "no host-side link appeared in the node netns"; fi
    else
        [[ -z $extra ]] || fail "macvlan mode created links in the node netns: $extra"
    fi

    local reaped=''
    if [[ $REFERENCE == 0 ]]; then
        reaped=$(status_of "$cid" 's["retiredLinksDeletedTotal"]' 2>&1) || {
            fail "the daemon's status before rm -f: $reaped"
            reaped=''
        }
    fi
    t0=$(now_ms)
    if pod rm -f -t 0 "$cid" >/dev/null 2>&1; then ok "podman rm -f"; else fail "podman rm -f $cid"; fi
    log "rm -f took $(($(now_ms) - t0)) ms"
    if [[ $reaped =~ ^[0-9]+$ ]]; then
        # podman's DEL retired the pod's interface and handed it to the
        # daemon, which deleted it; the attachment is no longer served.
        if wait_status "$cid" "s[\"retiredLinksDeletedTotal\"] > $reaped and len(att) == 0" 15; then
            ok "DEL handed the pod's interface to edgelinkd, which deleted it (retiredLinksDeletedTotal $reaped -> $(status_of "$cid" 's["retiredLinksDeletedTotal"]'))"
        else
            fail "after rm -f: retiredLinksDeletedTotal still $reaped or the attachment still served: $(status_of "$cid" '(s["retiredLinksDeletedTotal"], att)' 2>&1)"
            daemon_log_tail
        fi
    fi
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
        # The daemon and the device's servers end with the case, whatever
        # ended it.
        trap 'rc=$?; [[ $rc == 0 || $CASE_FAILS != 0 ]] || echo "    FAIL: aborted (status $rc) at: $BASH_COMMAND"; stop_daemon; stop_device_servers' EXIT
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
