#!/usr/bin/env python3
"""Relay benchmark: edgelinkd against socat, HAProxy and nginx, side by side.

Topology (all namespaces created here, named after this process's pid, and
removed at the end, as are all the processes started here):

    client 10.244.1.20 --veth-- pod eth0 10.244.1.10      (the proxy pod)
                                pod net1 172.17.16.2xx    (a real plugin ADD,
                                  bridge mode: veth -> bridge edge0 in the
                                  node netns -> uplink0 --veth-- device)
                                device 172.17.16.120      (iperf3, echo peers)

edgelinkd runs in the node netns and serves the forwards the plugin
recorded; socat, HAProxy and nginx listen in the pod netns on other ports
and connect to the device over the same net1. "direct" is the routed path
without a relay: the client routes 172.17.16.0/24 via the pod, which
forwards (ip_forward=1) over net1, and the device routes back via net1's
address; the same links and hops as the relays, minus the relay.

Subjects alternate within each round for each measure (A B C ..., the order
rotating by one every round), so that machine drift hits them all alike.

    relay.py [--quick] [--rounds N] [--out FILE] [--only a,b,...]

Needs root, iproute2, iperf3, socat, haproxy, nginx with the stream module,
and `make release` (edgelinkd, elk-loadgen, the static plugin).
"""
import argparse
import ctypes
import errno
import json
import os
import resource
import selectors
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from cni import machine  # scripts/bench/cni.py: the same machine line in both halves
import verdict  # scripts/bench/verdict.py: which figures fail the run

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
NGINX_STREAM = "/usr/lib/nginx/modules/ngx_stream_module.so"
TAG = "elkrelay-%d" % os.getpid()
NODE, DEV, POD, CLIENT = (TAG + s for s in ("-node", "-dev", "-pod", "-cli"))
DEV_IP, POD_IP, CLIENT_IP = "172.17.16.120", "10.244.1.10", "10.244.1.20"
# Device services: iperf3, a fast TCP echo (elk-loadgen, thread per
# connection), a UDP echo, and an epoll TCP echo for the idle connections.
IPERF, ECHO, UDP, IDLE = 5201, 7000, 7001, 7002
NOFILE = 262144
FD_LIMIT = NOFILE  # what raise_nofile() got; set in main()
CLK = os.sysconf("SC_CLK_TCK")
libc = ctypes.CDLL("libc.so.6", use_errno=True)
CLONE_NEWNET = 0x40000000
SYS_PIDFD_GETFD = 438
F_GETPIPE_SZ = 1032


# --------------------------------------------------------------------------
# Helpers run as separate processes inside a namespace (relay.py _helper ...)

def helper_udp_echo(host, port):
    """UDP echo as fast as a plain Python loop goes (one recv, one send)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, 33, 8 << 20)  # SO_RCVBUFFORCE
    s.setsockopt(socket.SOL_SOCKET, 32, 8 << 20)  # SO_SNDBUFFORCE
    s.bind((host, int(port)))
    buf = bytearray(65536)
    mv = memoryview(buf)
    recv, send = s.recvfrom_into, s.sendto
    while True:
        n, peer = recv(buf)
        try:
            send(mv[:n], peer)
        except OSError:
            pass


def helper_idle_echo(host, port):
    """TCP echo on epoll for many mostly idle connections."""
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((host, int(port)))
    ls.listen(4096)
    ls.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(ls, selectors.EVENT_READ, None)
    while True:
        for key, _ in sel.select():
            if key.data is None:
                while True:
                    try:
                        c, _ = ls.accept()
                    except (BlockingIOError, InterruptedError):
                        break
                    except OSError:
                        time.sleep(0.01)
                        break
                    c.setblocking(False)
                    sel.register(c, selectors.EVENT_READ, 1)
                continue
            c = key.fileobj
            try:
                b = c.recv(65536)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                b = b""
            if not b:
                sel.unregister(c)
                c.close()
                continue
            try:
                c.send(b)  # small echoes: the send buffer always has room
            except OSError:
                sel.unregister(c)
                c.close()


HELPERS = {"_udp-echo": helper_udp_echo, "_idle-echo": helper_idle_echo}


# --------------------------------------------------------------------------
# Namespaces, processes, /proc

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


def in_ns(ns, fn, *args):
    """Run fn(*args) on a fresh thread that entered netns `ns` (sockets it
    makes live there; /proc/thread-self/net shows that netns)."""
    box = {}

    def run():
        try:
            fd = os.open("/var/run/netns/" + ns, os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns " + ns)
            finally:
                os.close(fd)
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


def proc_table():
    """pid -> (ppid, utime+stime+cutime+cstime ticks)."""
    out = {}
    for pid, f in proc_stats():
        out[pid] = (int(f[1]), int(f[11]) + int(f[12]) + int(f[13]) + int(f[14]))
    return out


def tree(roots, table=None):
    table = table if table is not None else proc_table()
    kids = {}
    for pid, (ppid, _) in table.items():
        kids.setdefault(ppid, []).append(pid)
    seen, todo = [], [r for r in roots if r in table]
    while todo:
        p = todo.pop()
        seen.append(p)
        todo.extend(kids.get(p, []))
    return seen


def cpu_seconds(roots):
    """CPU seconds of a process tree: every live process's own time and the
    time of its reaped children (so children that came and went between two
    readings are counted, as long as they were reaped)."""
    table = proc_table()
    return sum(table[p][1] for p in tree(roots, table)) / CLK


def mem_kib(roots):
    """(sum of VmRSS, sum of Pss) of a process tree, KiB."""
    rss = pss = 0
    for p in tree(roots):
        try:
            with open("/proc/%d/status" % p) as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        rss += int(line.split()[1])
            with open("/proc/%d/smaps_rollup" % p) as f:
                for line in f:
                    if line.startswith("Pss:"):
                        pss += int(line.split()[1])
        except OSError:
            pass
    return rss, pss


def pipes_held(roots):
    """(pipes, capacity bytes) held by a process tree: pipe descriptors from
    /proc/PID/fd, sizes with pidfd_getfd + F_GETPIPE_SZ where the kernel allows."""
    seen, cap = set(), 0
    for p in tree(roots):
        try:
            fds = os.listdir("/proc/%d/fd" % p)
        except OSError:
            continue
        pidfd = None
        for fd in fds:
            try:
                link = os.readlink("/proc/%d/fd/%s" % (p, fd))
            except OSError:
                continue
            if not link.startswith("pipe:") or link in seen:
                continue
            seen.add(link)
            try:
                if pidfd is None:
                    pidfd = os.pidfd_open(p)
                mine = libc.syscall(SYS_PIDFD_GETFD, pidfd, int(fd), 0)
                if mine >= 0:
                    import fcntl
                    cap += fcntl.fcntl(mine, F_GETPIPE_SZ)
                    os.close(mine)
            except (OSError, AttributeError):
                pass
        if pidfd is not None:
            os.close(pidfd)
    return len(seen), cap


def meminfo_kernel_kib():
    """Slab + KernelStack + PageTables from /proc/meminfo (KiB)."""
    want = {"Slab:", "KernelStack:", "PageTables:"}
    total = 0
    with open("/proc/meminfo") as f:
        for line in f:
            k = line.split()
            if k[0] in want:
                total += int(k[1])
    return total


def snmp(ns):
    """The Udp counters of a netns."""
    def read():
        with open("/proc/thread-self/net/snmp") as f:
            lines = [l.split() for l in f if l.startswith("Udp:")]
        return dict(zip(lines[0][1:], map(int, lines[1][1:])))
    return in_ns(ns, read)


def forwarded():
    """Datagrams a relay in the pod passed on, both ways: those the device
    and the client received (Udp InDatagrams of their netns). Counted at
    the receivers, since a relay that sends with UDP GSO makes one
    OutDatagrams of many datagrams."""
    return snmp(DEV)["InDatagrams"] + snmp(CLIENT)["InDatagrams"]


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


# --------------------------------------------------------------------------
# The lab

class Lab:
    def __init__(self, tmp, procs):
        self.tmp, self.procs, self.netns = tmp, procs, []
        self.state = os.path.join(tmp, "state")

    def build(self):
        os.makedirs(self.state)
        for ns in (NODE, DEV, POD, CLIENT):
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
        for ns in (CLIENT, POD):
            sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.tcp_tw_reuse=1")

    def attach(self, forwards):
        """edgelinkd in the node netns, then a real plugin ADD of net1 (bridge
        mode) with the forwards; returns net1's address."""
        self.daemon = self.procs.start("edgelinkd", NODE, [
            DAEMON, "run", "--state-dir", self.state, "--status-addr", "127.0.0.1:9310",
            "--log-level", "warn", "--probe-interval", "0"] + os.environ.get("EDGELINKD_ARGS", "").split())
        sock = os.path.join(self.state, "edgelinkd.sock")
        wait_for("edgelinkd's control socket", lambda: os.path.exists(sock), self.daemon, self.procs)
        conf = {"cniVersion": "1.0.0", "name": "relay-bench", "type": "edgelink", "mode": "bridge",
                "bridge": "edge0", "uplink": "uplink0", "stateDir": self.state,
                "ipam": {"ranges": [[{"subnet": "172.17.16.0/24", "rangeStart": "172.17.16.200",
                                      "rangeEnd": "172.17.16.250"}]], "nodeName": "bench"},
                "forwards": forwards}
        env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "relay-bench", "CNI_IFNAME": "net1",
               "CNI_NETNS": "/var/run/netns/" + POD, "CNI_PATH": "/usr/lib/cni",
               "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=proxy-0",
               "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
        p = subprocess.run(["ip", "netns", "exec", NODE, PLUGIN], input=json.dumps(conf).encode(),
                           env=env, capture_output=True, timeout=30)
        if p.returncode != 0:
            raise SystemExit("relay bench: plugin ADD failed: %s %s" % (p.stdout.decode(), p.stderr.decode()))
        net1 = json.loads(p.stdout)["ips"][0]["address"].split("/")[0]
        # The direct routed path: client -> pod (forwarding) -> net1 -> device.
        sh("ip", "netns", "exec", POD, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        sh("ip", "-n", CLIENT, "route", "add", "172.17.16.0/24", "via", POD_IP)
        sh("ip", "-n", DEV, "route", "add", "10.244.1.0/24", "via", net1)
        return net1

    def close(self):
        for ns in reversed(self.netns):
            sh("ip", "netns", "del", ns, check=False)


# --------------------------------------------------------------------------
# Subjects

class Subject:
    """A way from the client to the device services: host and ports
    {IPERF: p, ECHO: p, UDP: p or None, IDLE: p}, the processes whose CPU and
    memory are the relay's, and the exact commands it was run with."""

    def __init__(self, name, host, ports, procs=(), commands=(), peer=True):
        self.name, self.host, self.ports = name, host, ports
        self.procs, self.commands, self.peer = list(procs), list(commands), peer

    def pids(self):
        return [p.pid for p in self.procs]

    @property
    def is_relay(self):
        return bool(self.procs)


def relay_ports(base):
    return {IPERF: base + 201, ECHO: base, UDP: base + 1, IDLE: base + 2}


def start_socat(procs):
    ports = relay_ports(11000)
    ps, cmds = [], []
    for svc in (IPERF, ECHO, IDLE):
        argv = ["socat", "TCP4-LISTEN:%d,bind=%s,fork,reuseaddr" % (ports[svc], POD_IP),
                "TCP4:%s:%d" % (DEV_IP, svc)]
        ps.append(procs.start("socat-%d" % ports[svc], POD, argv))
        cmds.append(" ".join(argv))
    argv = ["socat", "UDP4-RECVFROM:%d,bind=%s,fork" % (ports[UDP], POD_IP), "UDP4-SENDTO:%s:%d" % (DEV_IP, UDP)]
    ps.append(procs.start("socat-%d" % ports[UDP], POD, argv))
    cmds.append(" ".join(argv))
    return Subject("socat", POD_IP, ports, ps, cmds)


def start_haproxy(procs, tmp, name, base, pipesize=None):
    ports = relay_ports(base)
    ports[UDP] = None  # HAProxy has no UDP proxy
    # HAProxy wants 2 descriptors per connection and 2 per pipe (by default
    # maxconn/4 pipes) below RLIMIT_NOFILE; where that is capped (no
    # CAP_SYS_RESOURCE), fewer pipes: more than 512 never splice at once here.
    maxconn = min(20000, (FD_LIMIT - 1600) // 2)
    cfg = ["global", "    maxconn %d" % maxconn]
    if FD_LIMIT < 60000:
        cfg.append("    maxpipes 512")
    if pipesize:
        cfg.append("    tune.pipesize %d" % pipesize)
    cfg += ["defaults", "    mode tcp", "    maxconn %d" % maxconn, "    timeout connect 5s",
            "    timeout client 10m", "    timeout server 10m",
            "    option splice-request", "    option splice-response"]
    for svc in (IPERF, ECHO, IDLE):
        cfg += ["listen p%d" % ports[svc], "    bind %s:%d" % (POD_IP, ports[svc]),
                "    server dev %s:%d" % (DEV_IP, svc)]
    path = os.path.join(tmp, name + ".cfg")
    with open(path, "w") as f:
        f.write("\n".join(cfg) + "\n")
    p = procs.start(name, POD, ["haproxy", "-f", path, "-db"])
    label = "HAProxy" + (" %d MiB pipes" % (pipesize >> 20) if pipesize else "")
    shown = [l.strip() for l in cfg[:cfg.index("listen p%d" % ports[IPERF]) + 3]]
    return Subject(label, POD_IP, ports, [p],
                   ["haproxy -f %s.cfg -db  # %s; (one listen section per port)" % (name, "; ".join(shown))])


def start_nginx(procs, tmp):
    ports = relay_ports(14000)
    d = os.path.join(tmp, "nginx")
    os.makedirs(d)
    conf = ["load_module %s;" % NGINX_STREAM, "worker_processes auto;", "worker_rlimit_nofile %d;" % FD_LIMIT,
            "events { worker_connections %d; }" % (FD_LIMIT - 200), "stream {"]
    for svc in (IPERF, ECHO, IDLE):
        conf.append("    server { listen %s:%d; proxy_pass %s:%d; }" % (POD_IP, ports[svc], DEV_IP, svc))
    conf.append("    server { listen %s:%d udp; proxy_pass %s:%d; }" % (POD_IP, ports[UDP], DEV_IP, UDP))
    conf.append("}")
    path = os.path.join(d, "nginx.conf")
    with open(path, "w") as f:
        f.write("\n".join(conf) + "\n")
    argv = ["nginx", "-p", d, "-c", path, "-e", "stderr",
            "-g", "daemon off; pid %s/nginx.pid; error_log stderr;" % d]
    p = procs.start("nginx", POD, argv)
    return Subject("nginx", POD_IP, ports, [p],
                   ["nginx -p DIR -c nginx.conf -g 'daemon off; ...'  # worker_processes auto; "
                    "server { listen %s:%d; proxy_pass %s:%d; } per port (udp for UDP)"
                    % (POD_IP, ports[ECHO], DEV_IP, ECHO)])


def edgelink_forwards():
    ports = relay_ports(15000)
    fw = [{"name": "iperf", "protocol": "tcp", "port": ports[IPERF], "target": "%s:%d" % (DEV_IP, IPERF)},
          {"name": "echo", "protocol": "tcp", "port": ports[ECHO], "target": "%s:%d" % (DEV_IP, ECHO)},
          {"name": "udp", "protocol": "udp", "port": ports[UDP], "target": "%s:%d" % (DEV_IP, UDP)},
          {"name": "idle", "protocol": "tcp", "port": ports[IDLE], "target": "%s:%d" % (DEV_IP, IDLE)}]
    return ports, fw


def wait_subject(s, procs):
    for svc, port in s.ports.items():
        if port is None or not s.is_relay:
            continue
        proto = "udp" if svc == UDP else "tcp"
        owner = s.procs[0] if s.procs else None
        wait_for("%s on %s port %d" % (s.name, proto, port),
                 lambda: listening(POD, port, proto), owner, procs)
    owner = s.procs[0] if s.procs else None
    wait_for("%s: a TCP echo through it" % s.name,
             lambda: works(CLIENT, tcp_echo_once, s.host, s.ports[ECHO]), owner, procs)
    if s.ports[UDP]:
        wait_for("%s: a UDP echo through it" % s.name,
                 lambda: works(CLIENT, udp_echo_once, s.host, s.ports[UDP]), owner, procs)


# --------------------------------------------------------------------------
# Measures. Each returns a dict of figures for one subject in one round.

def run_json(ns, argv, timeout):
    p = subprocess.run(["ip", "netns", "exec", ns] + argv, capture_output=True, text=True,
                       timeout=timeout, preexec_fn=raise_nofile)
    try:
        return json.loads(p.stdout)
    except ValueError:
        raise RuntimeError("`%s` gave no JSON (exit %d): %s" % (" ".join(argv), p.returncode,
                                                                (p.stdout + p.stderr)[-400:]))


class Bench:
    def __init__(self, procs, subjects, secs, device):
        self.procs, self.subjects, self.secs, self.device = procs, subjects, secs, device
        self.iperf_server = device["iperf"]

    def restart_iperf(self):
        self.procs.stop(self.iperf_server)
        self.procs.started.remove(self.iperf_server)
        self.iperf_server = self.procs.start("iperf3-server", DEV, ["iperf3", "-s", "-B", DEV_IP, "-p", str(IPERF)])
        wait_for("iperf3 server", lambda: listening(DEV, IPERF), self.iperf_server, self.procs)

    def iperf(self, s, streams):
        argv = ["iperf3", "-J", "-c", s.host, "-p", str(s.ports[IPERF]), "-t", str(self.secs["iperf"]),
                "-P", str(streams), "--connect-timeout", "3000"]
        for attempt in (1, 2):
            cpu0 = cpu_seconds(s.pids())
            try:
                r = run_json(CLIENT, argv, self.secs["iperf"] + 30)
                if "error" in r:
                    raise RuntimeError(r["error"])
                end = r["end"]["sum_received"]
                time.sleep(0.2)  # let socat's children exit and be reaped
                cpu = cpu_seconds(s.pids()) - cpu0
                gb = end["bytes"] / 1e9
                out = {"gbps": end["bits_per_second"] / 1e9}
                if s.is_relay and streams == 1:
                    out["cpu_per_gb"] = cpu / gb if gb else float("nan")
                return out
            except (RuntimeError, subprocess.TimeoutExpired, KeyError) as e:
                if attempt == 2:
                    raise RuntimeError("iperf3 through %s failed twice: %s" % (s.name, e))
                print("  (iperf3 through %s failed: %s; restarting the iperf3 server and retrying)"
                      % (s.name, str(e)[:200]), flush=True)
                self.restart_iperf()

    def iperf1(self, s):
        r = self.iperf(s, 1)
        r["gbps1"] = r.pop("gbps")
        return r

    def conn_rate(self, s):
        cpu0 = cpu_seconds(s.pids()) if s.is_relay else 0.0
        r = run_json(CLIENT, [LOADGEN, "conn-rate", "%s:%d" % (s.host, s.ports[ECHO]), "--concurrency", "16",
                              "--seconds", str(self.secs["short"])], self.secs["short"] + 30)
        out = {"conn_s": r["per_second"], "conn_failed": r["failed"], "conn_ok": r["connections"]}
        if s.is_relay and r.get("connections"):
            out["conn_cpu_us"] = (cpu_seconds(s.pids()) - cpu0) * 1e6 / r["connections"]
        return out

    def rr(self, s):
        r = run_json(CLIENT, [LOADGEN, "rr", "%s:%d" % (s.host, s.ports[ECHO]), "--seconds",
                              str(self.secs["short"])], self.secs["short"] + 30)
        return {"p50_us": r["p50_us"], "p99_us": r["p99_us"]}

    def udp(self, s, key, clients, rate):
        if not s.ports.get(UDP):
            return {}
        u0, f0, cpu0 = snmp(POD), forwarded(), cpu_seconds(s.pids())
        secs = self.secs["udp"]
        r = run_json(CLIENT, [LOADGEN, "udp", "%s:%d" % (s.host, s.ports[UDP]), "--concurrency", str(clients),
                              "--rate", str(rate), "--size", "1400", "--seconds", str(secs)], secs + 30)
        u1, f1, cpu1 = snmp(POD), forwarded(), cpu_seconds(s.pids())
        # Per second of sending (the client's own "seconds" also counts the
        # 200 ms it waits for late echoes).
        out = {key + "_pps": r["received"] / secs, key + "_loss": r["loss"]}
        if s.is_relay:
            fwd = f1 - f0
            drops = (u1["RcvbufErrors"] - u0["RcvbufErrors"]) + (u1.get("SndbufErrors", 0) - u0.get("SndbufErrors", 0))
            out[key + "_fwd_pps"] = fwd / secs
            out[key + "_cpu_us"] = (cpu1 - cpu0) * 1e6 / fwd if fwd else float("nan")
            out[key + "_drops"] = drops / (fwd + drops) if fwd + drops else 0.0
        return out


def hold_connections(host, port, n, deadline_s):
    """Open n TCP connections, one 64-byte exchange on each, keep them open.
    Runs on a thread inside the client netns; returns (sockets, failed)."""
    sel = selectors.DefaultSelector()
    held, failed, started, inflight = [], 0, 0, 0
    # socat listens with a backlog of 5: keep fewer connects in flight than that
    window = 4
    deadline = time.monotonic() + deadline_s
    msg = b"i" * 64
    while len(held) + failed < n and time.monotonic() < deadline:
        while inflight < window and started < n:
            try:
                c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            except OSError:  # out of descriptors: keep what is open
                failed += n - started
                started = n
                break
            c.setblocking(False)
            err = c.connect_ex((host, port))
            if err not in (0, errno.EINPROGRESS):
                c.close()
                failed += 1
                started += 1
                continue
            sel.register(c, selectors.EVENT_WRITE, [0, time.monotonic()])
            started += 1
            inflight += 1
        for key, ev in sel.select(timeout=0.2):
            c, st = key.fileobj, key.data
            try:
                if st[0] == 0:
                    e = c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if e:
                        raise OSError(e, os.strerror(e))
                    c.send(msg)
                    st[0] = 1
                    sel.modify(c, selectors.EVENT_READ, st)
                else:
                    b = c.recv(64)
                    if not b:
                        raise OSError("closed")
                    st[0] += len(b)
                    if st[0] >= 65:
                        sel.unregister(c)
                        held.append(c)
                        inflight -= 1
            except OSError:
                sel.unregister(c)
                c.close()
                failed += 1
                inflight -= 1
        now = time.monotonic()
        for key in list(sel.get_map().values()):
            if now - key.data[1] > 10:  # one connection stuck for 10 s
                sel.unregister(key.fileobj)
                key.fileobj.close()
                failed += 1
                inflight -= 1
    for key in list(sel.get_map().values()):
        key.fileobj.close()
        failed += 1
    sel.close()
    return held, failed


def idle_memory(s, n):
    """User-space and kernel memory of n idle connections through s."""
    time.sleep(0.3)
    pids = s.pids()
    rss0, pss0 = mem_kib(pids)
    k0 = meminfo_kernel_kib()
    pipes0 = pipes_held(pids)
    t = time.monotonic()
    held, failed = in_ns(CLIENT, hold_connections, s.host, s.ports[IDLE], n, 90)
    took = time.monotonic() - t
    try:
        time.sleep(0.5)
        rss1, pss1 = mem_kib(pids)
        k1 = meminfo_kernel_kib()
        pipes1 = pipes_held(pids)
        procs_n = len(tree(pids))
    finally:
        for c in held:
            c.close()
    m = len(held)
    if m == 0:
        raise RuntimeError("no idle connection could be opened through %s (%d failed)" % (s.name, failed))
    out = {"idle_conns": m, "idle_failed": failed, "idle_open_s": took,
           "kernel_kib_conn": (k1 - k0) / m}
    if s.is_relay:
        out.update({"rss_kib_conn": (rss1 - rss0) / m, "pss_kib_conn": (pss1 - pss0) / m,
                    "pipes": pipes1[0], "pipe_mib": pipes1[1] / 2**20,
                    "pipes_added": pipes1[0] - pipes0[0], "procs": procs_n})
    # Let the relay close its side (socat: its children exit) before the
    # next subject is measured.
    if s.name == "socat":
        wait_for("socat's children to exit", lambda: len(tree(pids)) <= len(pids), timeout=30)
    time.sleep(0.5)
    return out


def strace_counts(pids, fn):
    """fn() with `strace -c -f` attached to the process tree: (fn's result,
    {syscall: [calls, errors]})."""
    argv = ["strace", "-c", "-f", "-qq"]
    for p in tree(pids):
        argv += ["-p", str(p)]
    st = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, start_new_session=True)
    try:
        time.sleep(0.5)  # attached by then
        r = fn()
    finally:
        st.send_signal(signal.SIGINT)
        try:
            err = st.communicate(timeout=20)[1]
        except subprocess.TimeoutExpired:
            st.kill()
            err = st.communicate()[1]
    counts = {}
    for line in err.splitlines():
        c = line.split()
        if len(c) >= 5 and c[0][0].isdigit() and c[-1] != "total":
            calls = int(c[3])
            errors = int(c[4]) if len(c) == 6 else 0
            counts[c[-1]] = [calls, errors]
    return r, counts


def syscall_profiles(bench, subjects, results, secs):
    """Syscalls per unit of work of edgelinkd and of the best peer, under
    strace -c -f (strace slows both; the counts per unit are what matter)."""
    t = secs["profile"]
    by = {s.name: s for s in subjects}

    def tcp(s):
        r = run_json(CLIENT, ["iperf3", "-J", "-c", s.host, "-p", str(s.ports[IPERF]), "-t", str(t)], t + 30)
        return r["end"]["sum_received"]["bytes"] / 1e6

    def conn(s):
        return run_json(CLIENT, [LOADGEN, "conn-rate", "%s:%d" % (s.host, s.ports[ECHO]), "--concurrency", "16",
                                 "--seconds", str(t)], t + 30)["connections"]

    def udp(s):
        f0 = forwarded()
        run_json(CLIENT, [LOADGEN, "udp", "%s:%d" % (s.host, s.ports[UDP]), "--rate", "100000", "--size", "1400",
                          "--seconds", str(t)], t + 30)
        return forwarded() - f0

    out = []
    for title, unit, fn, key, higher in (("TCP 1 stream", "MB", tcp, "gbps1", True),
                                         ("short connections", "connection", conn, "conn_s", True),
                                         ("UDP 100 000/s, 1 client", "datagram", udp, "u100_cpu_us", False)):
        _, peer = best_peer(results, subjects, key, higher)
        for name in ("edgelinkd", peer):
            if name is None:
                continue
            s = by[name]
            try:
                work, counts = strace_counts(s.pids(), lambda: fn(s))
            except (RuntimeError, subprocess.TimeoutExpired, KeyError) as e:
                print("  (syscall profile of %s, %s: %s)" % (name, title, e), flush=True)
                continue
            if not work:
                continue
            total = sum(c[0] for c in counts.values())
            top = sorted(counts.items(), key=lambda kv: -kv[1][0])[:8]
            out.append((title, name, unit, work, total / work,
                        ", ".join("%s %.2f%s" % (k, c / work, " (%d%% failed)" % (100 * e // c) if e else "")
                                  for k, (c, e) in top)))
            print("profile %s %s: %.2f syscalls per %s" % (title, name, total / work, unit), flush=True)
    return out


# --------------------------------------------------------------------------
# Report

TCP_COLUMNS = [  # key, title, format, higher is better
    ("gbps1", "TCP 1 stream Gbit/s", "%.2f", True),
    ("gbps8", "TCP 8 streams Gbit/s", "%.2f", True),
    ("cpu_per_gb", "relay CPU s/GB (1 stream)", "%.3f", False),
    ("conn_s", "connections/s", "%.0f", True),
    ("conn_cpu_us", "relay CPU µs/connection", "%.1f", False),
    ("p50_us", "request/reply p50 µs", "%.0f", False),
    ("p99_us", "request/reply p99 µs", "%.0f", False),
]
UDP_COLUMNS = [  # per load: key suffix, title, format, higher is better
    ("pps", "pps delivered", "%.0f", True),
    ("loss", "loss", "%.1f%%", False),
    ("fwd_pps", "relay forwarded pps", "%.0f", True),
    ("cpu_us", "relay CPU µs/datagram", "%.2f", False),
    ("drops", "dropped at the relay's sockets", "%.1f%%", False),
]
# The UDP loads: key, clients, offered datagrams/s. The first is the issue's
# fixed offered load, where the UDP targets are read.
UDP_LOADS = [("u200", 1, 200000), ("u100", 1, 100000), ("u50", 50, 100000)]
MEM_COLUMNS = [
    ("idle_conns", "connections", "%d", True),
    ("rss_kib_conn", "relay RSS KiB/conn", "%.2f", False),
    ("pss_kib_conn", "relay PSS KiB/conn", "%.2f", False),
    ("kernel_kib_conn", "kernel KiB/conn, whole machine", "%.1f", False),
    ("kernel_extra", "kernel KiB/conn beyond direct", "%.1f", False),
    ("pipes", "pipes held by the relay", "%d", False),
    ("pipe_mib", "their capacity MiB", "%.1f", False),
]


def fmt(f, v):
    if v is None or v != v:
        return "–"
    if f.endswith("%%"):
        return f % (v * 100)
    return f % v


def med(vals):
    vals = [v for v in vals if v is not None and v == v]
    return statistics.median(vals) if vals else None


def cell(f, vals):
    vals = [v for v in vals if v is not None and v == v]
    if not vals:
        return "–"
    m = statistics.median(vals)
    if len(vals) == 1:
        return fmt(f, m)
    return "%s (%s–%s)" % (fmt(f, m), fmt(f, min(vals)), fmt(f, max(vals)))


def best_peer(results, subjects, key, higher):
    """(median, name) of the best peer (socat, HAProxy, nginx) for a figure."""
    vals = [(med(results[s.name].get(key, [])), s.name) for s in subjects if s.peer]
    vals = [(v, n) for v, n in vals if v is not None]
    if not vals:
        return None, None
    return (max if higher else min)(vals)




def version(argv):
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        return (p.stdout + p.stderr).strip().splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "?"


def table(w, subjects, results, columns, ratios=True):
    w("| subject | " + " | ".join(c[1] for c in columns) + " |")
    w("|---|" + "---|" * len(columns))
    for s in subjects:
        w("| %s | %s |" % (s.name, " | ".join(cell(c[2], results[s.name].get(c[0], [])) for c in columns)))
    if not ratios:
        return
    best, direct = [], []
    for k, _, f, higher in columns:
        e = med(results["edgelinkd"].get(k, []))
        b, bn = best_peer(results, subjects, k, higher)
        d = med(results["direct"].get(k, []))
        ratio_ok = not f.endswith("%%") and e is not None
        best.append("%.2f× %s" % (e / b, bn) if ratio_ok and b else "–")
        direct.append("%.2f×" % (e / d) if ratio_ok and d else "–")
    w("| *edgelinkd ÷ best peer* | " + " | ".join(best) + " |")
    w("| *edgelinkd ÷ direct* | " + " | ".join(direct) + " |")


def report(a, subjects, results, profile, secs, rounds, idle_n, started):
    lines = []
    w = lines.append
    cmd = "make bench" + (" QUICK=1" if a.quick else "")
    w("## Relay: edgelinkd against socat, HAProxy and nginx")
    w("")
    w("Measured %s on %s, `%s` (`python3 scripts/bench/relay.py%s`), %d round%s; within each round "
      "the subjects alternate for every measure (A B C …, the order rotating by one every round). "
      "Medians, with the range over the rounds in brackets. \"Best peer\" is the best of socat, "
      "both HAProxy variants and nginx in that column."
      % (time.strftime("%Y-%m-%d"), machine(), cmd, " --quick" if a.quick else "", rounds,
         "" if rounds == 1 else "s"))
    w("")
    w("Topology: client netns —veth— pod netns (eth0 %s; net1 made by a real plugin ADD in bridge "
      "mode: veth to the bridge edge0 in the node netns, its uplink a veth to the device) — device "
      "netns %s. edgelinkd runs in the node netns and serves the attachment's forwards; socat, "
      "HAProxy and nginx listen in the pod netns and reach the device over the same net1. "
      "**direct** is the path without a relay: the client routes the device segment via the pod "
      "(ip_forward=1), so packets cross the same links; it has no relay process, hence no relay "
      "CPU or memory." % (POD_IP, DEV_IP))
    w("")
    w("### TCP")
    w("")
    table(w, subjects, results, TCP_COLUMNS)
    w("")
    for key, clients, rate in UDP_LOADS:
        w("### UDP: 1400-byte datagrams, %s offered by %s%s" % (
            "{:,}/s".format(rate).replace(",", " "), "one client" if clients == 1 else "%d clients" % clients,
            " (the targets' load)" if key == UDP_LOADS[0][0] else ""))
        w("")
        table(w, [s for s in subjects if s.ports.get(UDP)], results,
              [(key + "_" + k, t, f, h) for k, t, f, h in UDP_COLUMNS])
        w("")
    w("HAProxy has no UDP proxy. socat's `UDP4-RECVFROM,fork` forks one child per datagram. "
      "Delivered: echoes back at the client per second of sending. Forwarded: datagrams received by "
      "the device and the client netns (Udp InDatagrams; both directions; counted at the receivers because "
      "a relay sending with UDP GSO makes one OutDatagrams of many). Dropped at the relay's sockets: the pod netns's "
      "RcvbufErrors+SndbufErrors, as a share of the datagrams that reached them. With the client, "
      "the relay and the echo sharing %d cores, delivered packets are partly a measure of CPU "
      "contention; the relay's own CPU per datagram is the cleaner figure." % os.cpu_count())
    w("")
    w("### Idle connections")
    w("")
    socat_n = med(results.get("socat", {}).get("idle_conns", []))
    w("%d connections held open through each subject%s, each after one 64-byte exchange; measured "
      "once, before the rounds, while every relay is fresh (a process keeps the memory it freed, so a "
      "second time finds it resident already). The relay's memory before and after, summed over its processes: VmRSS from "
      "/proc/PID/status and Pss from /proc/PID/smaps_rollup (for socat's forked children only Pss "
      "is meaningful). The kernel's: Slab+KernelStack+PageTables from /proc/meminfo (whole machine: "
      "the client's and the device's sockets are in it, which is what direct shows, and whatever "
      "else the machine did meanwhile). Pipes held after opening them: /proc/PID/fd, capacity by "
      "F_GETPIPE_SZ through pidfd_getfd; a pipe holds data pages only while bytes sit in it.%s"
      % (idle_n, " (socat: %d, one process per connection)" % socat_n if socat_n else "",
         " RLIMIT_NOFILE is capped at %d here (no CAP_SYS_RESOURCE), hence %d rather than 10 000."
         % (FD_LIMIT, idle_n) if idle_n < 10000 and not a.quick else ""))
    w("")
    kd = med(results["direct"].get("kernel_kib_conn", []))
    for s in subjects:
        k = med(results[s.name].get("kernel_kib_conn", []))
        results[s.name]["kernel_extra"] = [k - kd] if k is not None and kd is not None else []
    table(w, subjects, results, MEM_COLUMNS, ratios=False)
    w("")
    if profile:
        w("### Syscall profile: edgelinkd against the best peer")
        w("")
        w("`strace -c -f -p PID…` attached to the relay's processes during %g s of each load (strace "
          "slows every subject; the calls per unit of work are what compare). Top calls per unit; "
          "failed ones are mostly EAGAIN and EINPROGRESS." % secs["profile"])
        w("")
        w("| load | subject | syscalls per unit | top calls per unit |")
        w("|---|---|---|---|")
        for title, name, unit, work, per, top in profile:
            w("| %s | %s | %.2f per %s | %s |" % (title, name, per, unit, top))
        w("")
    w("### Targets (issue 4)")
    w("")
    w("| figure | target | edgelinkd | best peer | direct | edgelinkd ÷ | result |")
    w("|---|---|---|---|---|---|---|")
    tg = targets(subjects, results)
    for t in tg:
        w("| %s |" % " | ".join(t))
    w("")
    w("### How")
    w("")
    w("- TCP: `iperf3 -J -c HOST -p PORT -t %d [-P 8]` from the client netns against `iperf3 -s` on "
      "the device; Gbit/s received. Relay CPU per GB: utime+stime from /proc/PID/stat over the "
      "relay's process tree (socat's children included, live or reaped) during the 1-stream run, "
      "over the bytes received." % secs["iperf"])
    w("- Short connections: `elk-loadgen conn-rate HOST:PORT --concurrency 16 --seconds %g` (connect, "
      "64 bytes each way, close) against `elk-loadgen echo-server` on the device; "
      "net.ipv4.tcp_tw_reuse=1 in the client and pod netns for every subject." % secs["short"])
    w("- Latency: `elk-loadgen rr HOST:PORT --seconds %g` (one persistent connection, 64 bytes each way)."
      % secs["short"])
    w("- UDP: `elk-loadgen udp HOST:PORT --size 1400 --rate R --seconds %g [--concurrency 50]` "
      "(50 client sockets share the rate) against a Python UDP echo on the device (alone it keeps up "
      "with ~190k datagrams/s)." % secs["short"])
    w("")
    w("Subjects as run (in the pod netns unless said):")
    w("")
    for s in subjects:
        for c in s.commands:
            w("- %s: `%s`" % (s.name, c))
    w("")
    w("Versions: %s; %s; %s; %s; %s." % (version(["sh", "-c", "socat -V | sed -n 2p"]),
                                        version(["haproxy", "-v"]), version(["nginx", "-v"]),
                                        version(["iperf3", "--version"]), version([DAEMON, "--version"])))
    w("")
    w("Run time: %.0f s." % (time.time() - started))
    return "\n".join(lines) + "\n", tg


def targets(subjects, results):
    elk = "edgelinkd"

    def row(label, target, k, higher, factor, f, vs_direct=None):
        e = med(results[elk].get(k, []))
        b, bn = best_peer(results, subjects, k, higher)
        d = med(results["direct"].get(k, []))
        if e is None or b is None:
            return (label, target, fmt(f, e), "–", "–", "–", "not measured")
        ratio = e / b
        ok = ratio >= factor if higher else ratio <= factor
        misses = []
        if not ok:
            misses.append("%.0f%% %s" % (abs(ratio / factor - 1) * 100, "short" if higher else "over"))
        rtxt = "%.2f× best" % ratio
        if vs_direct is not None and d:
            rd = e / d
            rtxt += ", %.2f× direct" % rd
            if rd < vs_direct:
                misses.append("%.0f%% short of %.2f× direct" % ((1 - rd / vs_direct) * 100, vs_direct))
        return (label, target, fmt(f, e), "%s (%s)" % (fmt(f, b), bn), fmt(f, d) if d else "–", rtxt,
                "**met**" if not misses else "missed: " + ", ".join(misses))

    out = [
        row("TCP 1 stream (Gbit/s)", "≥ 1.1× best peer, ≥ 0.85× direct", "gbps1", True, 1.1, "%.2f", 0.85),
        row("TCP 8 streams (Gbit/s)", "≥ 1.15× best peer", "gbps8", True, 1.15, "%.2f"),
        row("relay CPU s/GB", "≤ 0.75× best peer", "cpu_per_gb", False, 0.75, "%.3f"),
        row("connections/s", "≥ 1.1× best peer", "conn_s", True, 1.1, "%.0f"),
        row("request/reply p99 (µs)", "≤ best peer", "p99_us", False, 1.0, "%.0f"),
        row("UDP relay CPU (µs/datagram)", "≤ 0.5× best peer", UDP_LOADS[0][0] + "_cpu_us", False, 0.5, "%.2f"),
        row("UDP pps delivered", "≥ 1.5× best peer", UDP_LOADS[0][0] + "_pps", True, 1.5, "%.0f"),
    ]
    v = med(results[elk].get("rss_kib_conn", []))
    if v is None:
        out.append(("idle connection, user space (KiB)", "≤ 4 KiB", "–", "–", "–", "–", "not measured"))
    else:
        b, bn = best_peer(results, subjects, "pss_kib_conn", False)
        k = med(results[elk].get("kernel_kib_conn", []))
        kd = med(results["direct"].get("kernel_kib_conn", []))
        out.append(("idle connection, user space (KiB)", "≤ 4 KiB (kernel beside it: %.1f KiB/conn, "
                    "%.1f beyond direct; %s pipes held)" % (k, k - kd, fmt("%d", med(results[elk].get("pipes", [])))),
                    "%.2f" % v, "%.2f (%s, Pss)" % (b, bn) if b is not None else "–", "–",
                    "%.2f× best" % (v / b) if b else "–",
                    "**met**" if v <= 4 else "missed: %.2f KiB over" % (v - 4)))
    return out


SOCAT_IDLE_MAX = 2000  # socat forks a process per connection; 10 000 would use a third of pid_max


# --------------------------------------------------------------------------

def bring_up(lab, procs, only=None):
    """The lab, the device services and every subject, each checked end to end."""
    tmp = lab.tmp
    lab.build()
    # Device services.
    device = {"iperf": procs.start("iperf3-server", DEV, ["iperf3", "-s", "-B", DEV_IP, "-p", str(IPERF)]),
              "echo": procs.start("echo-server", DEV, [LOADGEN, "echo-server", "%s:%d" % (DEV_IP, ECHO)]),
              "udp": procs.start("udp-echo", DEV, [sys.executable, os.path.abspath(__file__), "_udp-echo", DEV_IP, str(UDP)]),
              "idle": procs.start("idle-echo", DEV, [sys.executable, os.path.abspath(__file__), "_idle-echo", DEV_IP, str(IDLE)])}
    for svc, port, proto in (("iperf", IPERF, "tcp"), ("echo", ECHO, "tcp"), ("udp", UDP, "udp"), ("idle", IDLE, "tcp")):
        wait_for("device %s on %s port %d" % (svc, proto, port), lambda: listening(DEV, port, proto),
                 device[svc], procs)

    elk_ports, forwards = edgelink_forwards()
    lab.attach(forwards)
    subjects = [Subject("direct", DEV_IP, {IPERF: IPERF, ECHO: ECHO, UDP: UDP, IDLE: IDLE},
                        commands=["client -> %s via the pod (routed, no relay)" % DEV_IP], peer=False)]
    want = lambda k: only is None or k in only
    if want("socat"):
        subjects.append(start_socat(procs))
    if want("haproxy"):
        subjects.append(start_haproxy(procs, tmp, "haproxy", 12000))
    if want("haproxy1m"):
        subjects.append(start_haproxy(procs, tmp, "haproxy-1m", 13000, pipesize=1 << 20))
    if want("nginx"):
        subjects.append(start_nginx(procs, tmp))
    subjects.append(Subject("edgelinkd", POD_IP, elk_ports, [lab.daemon],
                            ["edgelinkd run --state-dir DIR --log-level warn --probe-interval 0  (node netns; "
                             "defaults: 1 MiB pipes, sockets made on demand)",
                             "plugin ADD: mode bridge, forwards %s" % ", ".join(
                                 "%s/%d -> %s" % (f["protocol"], f["port"], f["target"]) for f in forwards)],
                            peer=False))
    for s in subjects:
        wait_subject(s, procs)
    return subjects, device


def interrupted(*_):
    raise KeyboardInterrupt("SIGTERM")


def main():
    if len(sys.argv) > 1 and sys.argv[1] in HELPERS:
        HELPERS[sys.argv[1]](*sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="one short round (CI)")
    ap.add_argument("--rounds", type=int, help="rounds (default 3, 1 with --quick)")
    ap.add_argument("--out", help="write the markdown section here")
    ap.add_argument("--only", help="comma-separated subjects: direct,socat,haproxy,haproxy1m,nginx,edgelinkd")
    ap.add_argument("--measures", help="comma-separated measures (default all): idle,tcp1,tcp8,conn,rr,udp,profile")
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("relay bench: run as root (network namespaces)")
    rounds = a.rounds or (1 if a.quick else 3)
    secs = {"iperf": 2, "short": 1, "udp": 1, "profile": 1} if a.quick else \
        {"iperf": 10, "short": 2, "udp": 2, "profile": 2}
    idle_n = 1000 if a.quick else 10000
    missing = [b for b in (PLUGIN, DAEMON, LOADGEN) if not os.access(b, os.X_OK)]
    missing += [b for b in ("socat", "haproxy", "nginx", "iperf3", "ip") if not shutil.which(b)]
    if not os.path.exists(NGINX_STREAM):
        missing.append(NGINX_STREAM + " (libnginx-mod-stream)")
    if missing:
        raise SystemExit("relay bench: missing %s (make bench builds and installs everything)" % ", ".join(missing))
    only = set(a.only.split(",")) if a.only else None
    picked = set(a.measures.split(",")) if a.measures else None

    def wanted(key):
        return picked is None or key in picked

    global FD_LIMIT
    FD_LIMIT = raise_nofile()
    # A relay holds two descriptors per connection.
    idle_n = min(idle_n, (FD_LIMIT - 2000) // 2)
    started = time.time()
    tmp = tempfile.mkdtemp(prefix="edgelink-relay-bench-")
    procs = Procs(tmp)
    lab = Lab(tmp, procs)
    # SIGTERM (CI timeouts) unwinds through the finally below like Ctrl-C.
    signal.signal(signal.SIGTERM, interrupted)
    try:
        subjects, device = bring_up(lab, procs, only)
        print("relay bench: lab up in %.1f s; subjects: %s" % (time.time() - started, ", ".join(s.name for s in subjects)),
              flush=True)

        bench = Bench(procs, subjects, secs, device)
        results = {s.name: {} for s in subjects}
        errors = []
        measures = [
            ("tcp1", "TCP 1 stream", bench.iperf1),
            ("tcp8", "TCP 8 streams", lambda s: {"gbps8": bench.iperf(s, 8)["gbps"]}),
            ("conn", "short connections", bench.conn_rate),
            ("rr", "request/reply", bench.rr),
        ] + [("udp", "UDP %d client%s at %d/s" % (c, "" if c == 1 else "s", r),
              (lambda k, c, r: lambda s: bench.udp(s, k, c, r))(k, c, r)) for k, c, r in UDP_LOADS]
        # A load well within capacity, where edgelinkd's loss is checked
        # (verdict.py); the peers skip it.
        ck, cc, cr = verdict.UDP_CHECK_LOAD
        measures.append(("udp", "UDP check load, %d client at %d/s" % (cc, cr),
                         lambda s: {} if s.peer else bench.udp(s, ck, cc, cr)))
        measures = [(t, fn) for key, t, fn in measures if wanted(key)]
        # Idle connections first, once, while every relay is fresh: a
        # process keeps the memory it freed, so a second time would find it
        # resident already and show (almost) nothing.
        for s in (subjects if wanted("idle") else []):
            try:
                got = idle_memory(s, min(idle_n, SOCAT_IDLE_MAX) if s.name == "socat" else idle_n)
            except (RuntimeError, SystemExit, OSError) as e:
                errors.append("idle connections, %s: %s" % (s.name, str(e)[:300]))
                print("  FAILED: " + errors[-1], flush=True)
                continue
            for key, v in got.items():
                results[s.name][key] = [v]
            print("idle connections %s: %s" % (s.name, " ".join("%s=%.4g" % kv for kv in got.items())), flush=True)
        for r in range(rounds):
            k = r % len(subjects)
            order = subjects[k:] + subjects[:k]
            for title, fn in measures:
                line = []
                for s in order:
                    try:
                        got = fn(s)
                    except (RuntimeError, subprocess.TimeoutExpired, KeyError, ValueError, OSError) as e:
                        errors.append("round %d, %s, %s: %s" % (r + 1, title, s.name, str(e)[:300]))
                        print("  FAILED: " + errors[-1], flush=True)
                        continue
                    for key, v in got.items():
                        results[s.name].setdefault(key, []).append(v)
                    line.append("%s %s" % (s.name, " ".join("%s=%.4g" % kv for kv in got.items())))
                print("round %d %s: %s" % (r + 1, title, "; ".join(line)), flush=True)
        if not wanted("profile"):
            profile = None
        elif shutil.which("strace"):
            profile = syscall_profiles(bench, subjects, results, secs)
        else:
            profile = None
            print("relay bench: strace is not installed: no syscall profile", flush=True)
    finally:
        procs.stop_all()
        lab.close()
        shutil.rmtree(tmp, ignore_errors=True)

    text, _ = report(a, subjects, results, profile, secs, rounds, idle_n, started)
    if errors:
        text += "\nFailed measurements (not in the figures above):\n\n" + "".join("- %s\n" % e for e in errors)
    failed, notes = verdict.relay_checks(results, {s.name for s in subjects if s.peer})
    text += "\n" + "\n".join(verdict.section("Checks: edgelinkd loses no work", failed, notes))
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    if failed:
        raise SystemExit("relay bench: FAILED: " + "; ".join(failed))
    if errors:
        raise SystemExit("relay bench: %d measurement(s) failed (listed above)" % len(errors))


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        raise SystemExit("relay bench: interrupted (namespaces and peers removed)")
