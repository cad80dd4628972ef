"""The relay bench's lab: network namespaces, the topology, the processes
started in them, and probes of what listens and what answers.

Every namespace and process made here is named after this process's pid
and removed by Lab.close() and Procs.stop_all(), which relay.py calls in a
`finally`. Nothing here sends from the host netns: probes run on a thread
that entered the client netns (in_ns).
"""
import ctypes
import json
import os
import resource
import signal
import socket
import subprocess
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _plugin():
    """The installed build: `make release` links it statically under
    target/<host triple>/release (EDGELINK_BIN from the Makefile names it)."""
    if os.environ.get("EDGELINK_BIN"):
        return os.path.abspath(os.environ["EDGELINK_BIN"])
    import glob
    static = sorted(glob.glob(os.path.join(ROOT, "target", "*", "release", "edgelink")))
    return static[0] if static else os.path.join(ROOT, "target/release/edgelink")


PLUGIN = _plugin()
DAEMON = os.environ.get("EDGELINKD_BIN", os.path.join(ROOT, "target/release/edgelinkd"))
LOADGEN = os.environ.get("LOADGEN_BIN", os.path.join(ROOT, "target/release/elk-loadgen"))


# The lab node's policy (docs/configuration.md, "The node decides"): the
# uplinks its configs name. The plugin reads it from its state directory,
# which the runtime's environment names (EDGELINK_STATE_DIR).
LAB_POLICY = '{"uplinks": ["uplink0", "uplink1"]}\n'


def node_env(env, conf):
    """Set EDGELINK_STATE_DIR in `env` to the config's stateDir, as root
    sets it for a node's runtime, and write the lab's node policy there."""
    state = conf.get("stateDir")
    if not state:
        return env
    env["EDGELINK_STATE_DIR"] = state
    path = os.path.join(state, "node-policy.json")
    if not os.path.exists(path):
        os.makedirs(state, exist_ok=True)
        with open(path, "w") as f:
            f.write(LAB_POLICY)
    return env
NGINX_STREAM = "/usr/lib/nginx/modules/ngx_stream_module.so"
TAG = "elkrelay-%d" % os.getpid()
NODE, DEV, POD, CLIENT = (TAG + s for s in ("-node", "-dev", "-pod", "-cli"))
DEV_IP, POD_IP, CLIENT_IP = "172.17.16.120", "10.244.1.10", "10.244.1.20"
# The kernel path's pod: a second pod netns, its eth0 a veth to the
# client's eth1, its net1 from a second plugin ADD on the same bridge. Its
# own pod because the kernel path's table drops, in the pod's forward hook,
# whatever it did not DNAT: the direct path, routed through POD, would
# break if that table were in POD.
KPOD = TAG + "-kpod"
KPOD_IP, CLIENT_KIP = "10.244.2.10", "10.244.2.20"
# Device services: iperf3, a fast TCP echo (elk-loadgen, thread per
# connection), a UDP echo, an epoll TCP echo for the idle connections, and
# a TCP echo that closes first after one request (sustained.py).
IPERF, ECHO, UDP, IDLE, CLOSE = 5201, 7000, 7001, 7002, 7004  # 7003: fragile.py
# The request the closing echo answers before it closes.
CLOSE_REQUEST = 64
NOFILE = 262144
FD_LIMIT = NOFILE  # what raise_nofile() got; set in main()
libc = ctypes.CDLL("libc.so.6", use_errno=True)
CLONE_NEWNET = 0x40000000


def use_tag(tag):
    """Name this process's namespaces TAG-node, TAG-dev, ... instead of
    elkrelay-PID-*: the soak and chaos scenarios (scripts/soak/common.py)
    name theirs after the scenario. Read the names as lab.NODE etc. after
    this, not through `from lab import NODE`."""
    global TAG, NODE, DEV, POD, CLIENT, KPOD
    TAG = tag
    NODE, DEV, POD, CLIENT = (tag + s for s in ("-node", "-dev", "-pod", "-cli"))
    KPOD = tag + "-kpod"


def sh(*args, check=True, timeout=60):
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise SystemExit("relay bench: `%s` failed: %s%s" % (" ".join(args), p.stdout, p.stderr))
    return p


def raise_nofile():
    """RLIMIT_NOFILE as high as allowed: NOFILE, or the hard limit where we
    lack CAP_SYS_RESOURCE (some sandboxes). Returns the limit."""
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))
    except (ValueError, OSError):
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def enter(ns):
    """The calling thread enters netns `ns` (a named one, `ip netns`)."""
    fd = os.open("/var/run/netns/" + ns, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns " + ns)
    finally:
        os.close(fd)


def in_ns(ns, fn, *args):
    """Run fn(*args) on a fresh thread that entered netns `ns` (sockets it
    makes live there; /proc/thread-self/net shows that netns)."""
    box = {}

    def run():
        try:
            enter(ns)
            box["v"] = fn(*args)
        except BaseException as e:  # handed to the caller
            box["e"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join()
    if "e" in box:
        raise box["e"]
    return box.get("v")


def proc_stats():
    """(pid, the fields of /proc/PID/stat after the command) of every live
    process: fields[0] is the state, [1] the ppid, [3] the session."""
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                s = f.read()
        except OSError:
            continue
        yield int(d), s[s.rindex(")") + 2:].split()


def listening(ns, port, proto="tcp"):
    """Whether a socket in netns `ns` listens on `port` (TCP LISTEN, or a
    bound UDP socket)."""
    def read():
        for fam in ("", "6"):
            try:
                with open("/proc/thread-self/net/%s%s" % (proto, fam)) as f:
                    next(f)
                    for line in f:
                        c = line.split()
                        if int(c[1].rsplit(":", 1)[1], 16) == port and (proto == "udp" or c[3] == "0A"):
                            return True
            except OSError:
                pass
        return False
    return in_ns(ns, read)


class Procs:
    """Every process started here; each in its own process group, so that
    killing the group takes its children (socat's, nginx's workers) too."""

    def __init__(self, tmp):
        self.tmp, self.started = tmp, []

    def start(self, name, ns, argv, stdout=None):
        log = open(os.path.join(self.tmp, name + ".log"), "w+")
        p = subprocess.Popen(["ip", "netns", "exec", ns] + argv, stdin=subprocess.DEVNULL,
                             stdout=stdout or log, stderr=log, preexec_fn=raise_nofile,
                             start_new_session=True)
        p.name, p.log = name, log
        self.started.append(p)
        return p

    def tail(self, p, n=1500):
        try:
            p.log.flush()
            p.log.seek(0)
            return p.log.read()[-n:].strip()
        except (OSError, ValueError):
            return ""

    @staticmethod
    def session(sid):
        """Live processes of session `sid` (each started process leads its
        own session: that is it and its children)."""
        return [pid for pid, f in proc_stats() if int(f[3]) == sid]

    def stop(self, p):
        """SIGTERM, then SIGKILL, to the process and everything in its session."""
        for sig, grace in ((signal.SIGTERM, 3), (signal.SIGKILL, 3)):
            members = self.session(p.pid)
            for pid in members:
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                p.poll()
                if not self.session(p.pid):
                    break
                time.sleep(0.05)
            else:
                continue
            break
        try:
            p.wait(timeout=1)
        except subprocess.TimeoutExpired:
            pass
        p.log.close()

    def stop_all(self):
        for p in reversed(self.started):
            self.stop(p)
        self.started = []


def wait_for(what, cond, proc=None, procs=None, timeout=15.0):
    """Poll cond() up to `timeout` seconds; fail clearly (with the peer's
    stderr) if it never holds or the peer exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        if proc is not None and proc.poll() is not None:
            raise SystemExit("relay bench: %s: %s exited with %s:\n%s"
                             % (what, proc.name, proc.returncode, procs.tail(proc)))
        time.sleep(0.05)
    tail = ("\n" + procs.tail(proc)) if proc is not None else ""
    raise SystemExit("relay bench: %s did not come up within %.0f s%s" % (what, timeout, tail))


def tcp_echo_once(host, port, timeout=2.0):
    s = socket.create_connection((host, port), timeout=timeout)
    try:
        s.sendall(b"p" * 64)
        got = b""
        while len(got) < 64:
            b = s.recv(64 - len(got))
            if not b:
                return False
            got += b
        return got == b"p" * 64
    finally:
        s.close()


def udp_echo_once(host, port, timeout=0.3):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(timeout)
    try:
        s.sendto(b"u" * 64, (host, port))
        return s.recvfrom(2048)[0] == b"u" * 64
    except OSError:
        return False
    finally:
        s.close()


def works(ns, fn, *args):
    try:
        return bool(in_ns(ns, fn, *args))
    except OSError:
        return False


class Lab:
    def __init__(self, tmp, procs):
        self.tmp, self.procs, self.netns = tmp, procs, []
        self.state = os.path.join(tmp, "state")

    def build(self):
        os.makedirs(self.state)
        for ns in (NODE, DEV, POD, KPOD, CLIENT):
            sh("ip", "netns", "add", ns)
            self.netns.append(ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        # The device segment: a switch in the device netns, the node's uplink on it.
        sh("ip", "-n", DEV, "link", "add", "sw0", "type", "bridge")
        sh("ip", "-n", NODE, "link", "add", "uplink0", "type", "veth", "peer", "name", "port0", "netns", DEV)
        sh("ip", "-n", DEV, "link", "set", "port0", "master", "sw0", "up")
        sh("ip", "-n", DEV, "link", "set", "sw0", "up")
        sh("ip", "-n", NODE, "link", "set", "uplink0", "up")
        sh("ip", "-n", DEV, "addr", "add", DEV_IP + "/24", "dev", "sw0")
        # The cluster side: client <-> the pod's eth0.
        sh("ip", "-n", POD, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", CLIENT)
        sh("ip", "-n", POD, "addr", "add", POD_IP + "/24", "dev", "eth0")
        sh("ip", "-n", CLIENT, "addr", "add", CLIENT_IP + "/24", "dev", "eth0")
        sh("ip", "-n", POD, "link", "set", "eth0", "up")
        sh("ip", "-n", CLIENT, "link", "set", "eth0", "up")
        # The same for the kernel path's pod, on the client's eth1.
        sh("ip", "-n", KPOD, "link", "add", "eth0", "type", "veth", "peer", "name", "eth1", "netns", CLIENT)
        sh("ip", "-n", KPOD, "addr", "add", KPOD_IP + "/24", "dev", "eth0")
        sh("ip", "-n", CLIENT, "addr", "add", CLIENT_KIP + "/24", "dev", "eth1")
        sh("ip", "-n", KPOD, "link", "set", "eth0", "up")
        sh("ip", "-n", CLIENT, "link", "set", "eth1", "up")
        # DEV: the client of the reverse direction (reverse.py).
        for ns in (CLIENT, POD, KPOD, DEV):
            sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.tcp_tw_reuse=1")

    def attach(self, forwards, reverse=()):
        """edgelinkd in the node netns, then a real plugin ADD of net1 (bridge
        mode) in POD with the forwards and the reverse forwards; returns
        net1's address (also self.net1)."""
        write_access_rules(self.state)
        self.daemon = self.procs.start("edgelinkd", NODE, [
            DAEMON, "run", "--state-dir", self.state, "--status-addr", "127.0.0.1:9310",
            "--log-level", "warn", "--probe-interval", "0"] + os.environ.get("EDGELINKD_ARGS", "").split())
        sock = os.path.join(self.state, "edgelinkd.sock")
        wait_for("edgelinkd's control socket", lambda: os.path.exists(sock), self.daemon, self.procs)
        net1 = self._add(POD, "relay-bench", "proxy-0", forwards, list(reverse))
        self.forwards, self.net1 = forwards, net1
        # The direct routed path: client -> pod (forwarding) -> net1 -> device.
        sh("ip", "netns", "exec", POD, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        sh("ip", "-n", CLIENT, "route", "add", "172.17.16.0/24", "via", POD_IP)
        sh("ip", "-n", DEV, "route", "add", "10.244.1.0/24", "via", net1)
        return net1

    def attach_kernel(self, forwards):
        """A second plugin ADD, of net1 in KPOD, with the kernel path's
        forwards (`"path": "kernel"`): edgelinkd installs their nftables
        table in KPOD and turns forwarding on there itself. The device needs
        no route back: the table masquerades to net1's address."""
        return self._add(KPOD, "relay-bench-kernel", "proxy-1", forwards)

    def _add(self, ns, container, pod, forwards, reverse=None):
        conf = {"cniVersion": "1.0.0", "name": "relay-bench", "type": "edgelink", "mode": "bridge",
                "bridge": "edge0", "uplink": "uplink0", "stateDir": self.state,
                "ipam": {"ranges": [[{"subnet": "172.17.16.0/24", "rangeStart": "172.17.16.200",
                                      "rangeEnd": "172.17.16.250"}]], "nodeName": "bench"},
                "forwards": forwards}
        if reverse:
            conf["reverse"] = reverse
        env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": container, "CNI_IFNAME": "net1",
               "CNI_NETNS": "/var/run/netns/" + ns, "CNI_PATH": "/usr/lib/cni",
               "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=" + pod,
               "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
        node_env(env, conf)
        p = subprocess.run(["ip", "netns", "exec", NODE, PLUGIN], input=json.dumps(conf).encode(),
                           env=env, capture_output=True, timeout=30)
        if p.returncode != 0:
            raise SystemExit("relay bench: plugin ADD in %s failed: %s %s" % (ns, p.stdout.decode(), p.stderr.decode()))
        return json.loads(p.stdout)["ips"][0]["address"].split("/")[0]

    def close(self):
        for ns in reversed(self.netns):
            sh("ip", "netns", "del", ns, check=False)


def write_access_rules(state):
    """Access rules for the relay's pod, as edgelink-operator sends them
    (issue 26), where edgelinkd finds them at start: the client allowed
    among 255 other addresses, so that every connection and datagram pays
    for the check as on a Device with allowedClients. EDGELINK_BENCH_ACCESS=0
    leaves them out (the pod is then open to every client). An edgelinkd
    from before issue 26 ignores the file."""
    if os.environ.get("EDGELINK_BENCH_ACCESS", "1") == "0":
        return
    allowed = [{"address": "10.244.9.%d" % i, "pod": "bench/other-%d" % i} for i in range(1, 256)]
    allowed += [{"address": a, "pod": "bench/client"} for a in (CLIENT_IP, CLIENT_KIP)]
    rules = {"generation": "bench", "attachments": {
        "bench/proxy-0": {"device": "bench/device", "allowed": allowed}}}
    os.makedirs(state, mode=0o700, exist_ok=True)
    with open(os.path.join(state, "access.json"), "w") as f:
        json.dump(rules, f)


def run_json(ns, argv, timeout):
    p = subprocess.run(["ip", "netns", "exec", ns] + argv, capture_output=True, text=True,
                       timeout=timeout, preexec_fn=raise_nofile)
    try:
        return json.loads(p.stdout)
    except ValueError:
        raise RuntimeError("`%s` gave no JSON (exit %d): %s" % (" ".join(argv), p.returncode,
                                                                (p.stdout + p.stderr)[-400:]))
