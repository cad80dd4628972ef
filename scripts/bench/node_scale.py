#!/usr/bin/env python3
"""One edge node with many attachments, without Kubernetes: edgelinkd and
the plugin as a runtime drives them, in namespaces this script creates.

N pod namespaces each get an attachment (the plugin's ADD, macvlan on the
node's uplink, built-in IPAM) with 4 forwards (TCP 8080, 8081, 80, UDP
5000) and a TCP health probe every 2 s, all to one device namespace
whose listeners accept and close. Printed: the plugin's ADD latency on
a node with one attachment (the one ADDed) and with N once edgelinkd
serves them all, each ADD timed alone on a settled node (medians of 15;
the same with edgelinkd stopped by SIGSTOP, what the plugin and the
kernel cost without it); ADD at N in a burst (15 one after another, as
pods arrive at once) against ADD/DEL one after another at 1; the time to
ADD N one after another and until edgelinkd serves them, and its CPU per
ADD meanwhile; edgelinkd's RSS, fds and CPU; its full reconcile pass
(edgelink_reconcile_pass_seconds, of plain `rescan`s); /status and
/metrics size and latency; the webhook's reports (to a receiver here) on
the wire and as JSON; DEL of all.

The goals of issue 25 (at 500): RSS <= 200 MiB, a pass <= 100 ms,
/metrics <= 1 s, ADD at 500 within 1.5x ADD at 1. `make bench-scale`
measures the same on the kube lab, with the real runtime and operator.

    node_scale.py [--attachments 500] [--samples 10] [--perf FILE] [--strace FILE]

--perf FILE records edgelinkd with `perf record --call-graph dwarf` during the
samples (build with CARGO_PROFILE_RELEASE_DEBUG=1 for its stacks); --strace
FILE traces one ADD at 1 and one at N into FILE.1 and FILE.N.
"""
import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import lab  # scripts/bench/lab.py: enter()

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ELK = os.environ.get("EDGELINK_BIN", os.path.join(ROOT, "target/release/edgelink"))
DAEMON = os.environ.get("EDGELINKD_BIN", os.path.join(ROOT, "target/release/edgelinkd"))
TAG = "elkscale-%d" % os.getpid()
NODE, DEV = TAG + "-node", TAG + "-dev"
DEVICE = "10.30.0.10"
STATUS = "127.0.0.1:9312"

DEVICE_PY = r"""
import asyncio, socket
async def main():
    async def close(r, w):
        w.close()
    for p in (8080, 8081, 80):
        await asyncio.start_server(close, "0.0.0.0", p, backlog=1024)
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind(("0.0.0.0", 5000))
    loop = asyncio.get_running_loop()
    class Echo(asyncio.DatagramProtocol):
        def connection_made(self, t): self.t = t
        def datagram_received(self, d, a): self.t.sendto(d, a)
    await loop.create_datagram_endpoint(Echo, sock=u)
    await asyncio.sleep(3600)
asyncio.run(main())
"""


def sh(*args, check=True):
    return subprocess.run(args, check=check, capture_output=True, text=True)


def conf(state):
    return {
        "cniVersion": "1.0.0", "name": "scale", "type": "edgelink", "mode": "macvlan",
        "uplink": "uplink0", "stateDir": state,
        "ipam": {"ranges": [[{"subnet": "10.30.0.0/16", "rangeStart": "10.30.1.1",
                               "rangeEnd": "10.30.8.254"}]]},
        "forwards": [
            {"name": "api", "protocol": "tcp", "port": 8080, "target": DEVICE + ":8080"},
            {"name": "api2", "protocol": "tcp", "port": 8081, "target": DEVICE + ":8081"},
            {"name": "http", "protocol": "tcp", "port": 80, "target": DEVICE + ":80"},
            {"name": "telemetry", "protocol": "udp", "port": 5000, "target": DEVICE + ":5000"},
        ],
        "allowedTargets": [DEVICE + "/32"],
        "health": {"type": "tcp", "target": DEVICE + ":8080", "intervalMs": 2000, "timeoutMs": 1000},
    }


def cni(cmd, state, i, wrap=()):
    env = {"CNI_COMMAND": cmd, "CNI_CONTAINERID": "scale-%d" % i, "CNI_IFNAME": "net1",
           "CNI_NETNS": "/var/run/netns/%s-pod%d" % (TAG, i), "CNI_PATH": "/usr/lib/cni",
           "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=pod-%d" % i,
           "EDGELINK_STATE_DIR": state, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    t = time.perf_counter()
    p = subprocess.run(list(wrap) + [ELK], input=json.dumps(conf(state)).encode(), env=env,
                       capture_output=True)
    dt = time.perf_counter() - t
    if p.returncode != 0:
        raise SystemExit("%s %d failed: %s %s" % (cmd, i, p.stdout[-400:], p.stderr[-400:]))
    return dt


def get(path):
    t = time.perf_counter()
    with urllib.request.urlopen("http://%s%s" % (STATUS, path), timeout=30) as r:
        body = r.read()
    return time.perf_counter() - t, body


def metric(text, name):
    m = re.search(r"^%s(?:\{[^}]*\})? ([0-9.e+-]+)$" % re.escape(name), text, re.M)
    return float(m.group(1)) if m else None


def proc(pid):
    rss = 0
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
    return rss, len(os.listdir("/proc/%d/fd" % pid))


def rescan(state):
    """Ask for a pass as the plugin does after each ADD and DEL."""
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.connect(os.path.join(state, "edgelinkd.sock"))
    c.sendall(b"rescan\n")
    c.close()


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def serving(n):
    _, body = get("/status")
    s = json.loads(body)
    return sum(1 for a in s.get("attachments", []) if a.get("state") == "serving") >= n


class Webhook:
    """A receiver of edgelinkd's status reports (as the operator, 204),
    counting their bodies on the wire and gunzip'd."""

    def __init__(self):
        import gzip
        import http.server
        import threading
        self.reports, self.wire, self.json = 0, 0, 0
        me = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                whole = body
                if self.headers.get("Content-Encoding") == "gzip":
                    whole = gzip.decompress(body)
                if self.path.endswith("/status"):
                    me.reports += 1
                    me.wire += len(body)
                    me.json += len(whole)
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d/v1/status" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


def build_lab(n, state, made, procs):
    """The node and device namespaces (a veth between them: the node's
    uplink), the device's listeners, the node policy, n pod namespaces."""
    for ns in (NODE, DEV):
        sh("ip", "netns", "add", ns)
        made.append(ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
    sh("ip", "-n", NODE, "link", "add", "uplink0", "type", "veth", "peer", "name", "port0",
       "netns", DEV)
    sh("ip", "-n", NODE, "link", "set", "uplink0", "up")
    sh("ip", "-n", DEV, "addr", "add", DEVICE + "/16", "dev", "port0")
    sh("ip", "-n", DEV, "link", "set", "port0", "up")
    procs.append(subprocess.Popen(["ip", "netns", "exec", DEV, sys.executable, "-c", DEVICE_PY]))
    with open(os.path.join(state, "node-policy.json"), "w") as f:
        f.write('{"uplinks": ["uplink0"]}\n')
    os.chmod(state, 0o700)
    for i in range(n):
        ns = "%s-pod%d" % (TAG, i)
        sh("ip", "netns", "add", ns)
        made.append(ns)


def start_daemon(state, procs, webhook):
    """edgelinkd in the node namespace (this process is in it already),
    reporting to `webhook` (heartbeats off: nothing answers them)."""
    d = subprocess.Popen([DAEMON, "run", "--state-dir", state, "--status-addr", STATUS,
                          "--log-level", "warn", "--status-webhook", webhook.url,
                          "--status-webhook-heartbeat", "0"],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=open(os.path.join(state, "edgelinkd.log"), "w"))
    procs.append(d)
    deadline = time.time() + 10
    while not os.path.exists(os.path.join(state, "edgelinkd.sock")):
        if d.poll() is not None or time.time() > deadline:
            raise SystemExit("edgelinkd did not start")
        time.sleep(0.02)
    return d


# ADDs timed at 1 and at N (medians of these many).
ROUNDS = 15
# After an ADD or DEL: time for the pass it asks for (and the start of
# what it added) to end before the next one is timed.
SETTLE = 0.3


def settle():
    """Write back what the last phase left dirty: the records and IPAM
    files of a burst of ADDs stay dirty for 30 s (vm.dirty_expire), and
    until then each ADD's fsync writes the inode table blocks they share
    with it (ADD at N then cost up to 1.5x more, with or without
    edgelinkd). Every timed phase starts from a settled node."""
    os.sync()
    time.sleep(1)


def timed_rounds(state, i, d, f, key):
    """ROUNDS times: attachment i ADDed (timed) and DELed with edgelinkd
    running, then again with edgelinkd stopped (SIGSTOP), each after the
    last one's pass settled: f[key] and f[key + "_stopped"]."""
    settle()
    f[key], f[key + "_stopped"] = [], []
    for _ in range(ROUNDS):
        time.sleep(SETTLE)
        f[key].append(cni("ADD", state, i))
        time.sleep(SETTLE)
        cni("DEL", state, i)
        time.sleep(SETTLE)
        os.kill(d.pid, 19)
        try:
            f[key + "_stopped"].append(cni("ADD", state, i))
            cni("DEL", state, i)
        finally:
            os.kill(d.pid, 18)


def add_all(a, d, state, f):
    """ADD at 1 (alone, ROUNDS times, with edgelinkd running and stopped),
    then every attachment (the last ROUNDS timed one after another, as a
    burst of pods arrives: each ADD asks for a pass that runs beside the
    next ADD), and ADD at N as at 1."""
    timed_rounds(state, 0, d, f, "at1")
    # ADD and DEL one after another (a warm machine, as in a burst).
    settle()
    f["at1_warm"] = []
    for _ in range(ROUNDS):
        f["at1_warm"].append(cni("ADD", state, 0))
        cni("DEL", state, 0)
    if a.strace:
        cni("ADD", state, 0, ("strace", "-f", "-tt", "-T", "-o", a.strace + ".1"))
        cni("DEL", state, 0)
    n = a.attachments
    t, c = time.perf_counter(), cpu_seconds(d.pid)
    for i in range(n - ROUNDS):
        cni("ADD", state, i)
    f["up"] = time.perf_counter() - t
    f["up_cpu"] = cpu_seconds(d.pid) - c
    # ADD at N on a node that serves N: once edgelinkd has caught up with
    # the burst (ADDs timed while it still starts hundreds cost 3-4x).
    wait_serving(n - ROUNDS)
    f["served"] = time.perf_counter() - t
    time.sleep(3)
    timed_rounds(state, n - 1, d, f, "atn")
    settle()
    f["burst"] = [cni("ADD", state, i) for i in range(n - ROUNDS, n)]
    if a.strace:
        cni("DEL", state, n - 1)
        cni("ADD", state, n - 1, ("strace", "-f", "-tt", "-T", "-o", a.strace + ".%d" % n))
    wait_serving(n)


def wait_serving(n):
    deadline = time.time() + 120
    while not serving(n):
        if time.time() > deadline:
            raise SystemExit("not all %d attachments served within 120 s" % n)
        time.sleep(0.5)


def sample(a, d, state, f):
    """Passes (asked for as the plugin does), /metrics and /status, CPU."""
    perf = None
    if a.perf:
        perf = subprocess.Popen(["perf", "record", "-F", "499", "--call-graph", "dwarf,32768",
                                 "-o", a.perf, "-p", str(d.pid)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    f["passes"], f["status"], f["metrics"] = [], [], []
    c0, w0 = cpu_seconds(d.pid), time.perf_counter()
    for _ in range(a.samples):
        rescan(state)
        time.sleep(1.1)
        dt, body = get("/metrics")
        f["metrics"].append((dt, len(body)))
        f["passes"].append(metric(body.decode(), "edgelink_reconcile_pass_seconds"))
        dt, body = get("/status")
        f["status"].append((dt, len(body)))
    f["cpu"] = (cpu_seconds(d.pid) - c0) / (time.perf_counter() - w0)
    if perf:
        perf.send_signal(2)
        perf.wait()
    f["rss"], f["fds"] = proc(d.pid)


def report(n, f):
    med = statistics.median
    at1 = med(f["at1"])
    print("node scale: %d attachments of 4 forwards and a TCP health probe (every 2 s)" % n)
    print("  edgelinkd: RSS %.1f MiB (%.1f with none), fds %d (%d with none), CPU %.0f%% of a core"
          " (samples, /status and /metrics included)"
          % (f["rss"], f["rss0"], f["fds"], f["fds0"], f["cpu"] * 100))
    print("  reconcile pass: median %.1f ms, max %.1f ms (%d samples)"
          % (med(f["passes"]) * 1000, max(f["passes"]) * 1000, len(f["passes"])))
    print("  /status: %.2f MB in %.1f ms (median); /metrics: %.2f MB in %.1f ms"
          % (f["status"][0][1] / 1e6, med(x[0] for x in f["status"]) * 1000,
             f["metrics"][0][1] / 1e6, med(x[0] for x in f["metrics"]) * 1000))
    print("  ADD at 1: %.1f ms, at %d: %.1f ms (%.2fx); %d ADDed in %.1f s, served after %.1f s;"
          " all DEL in %.1f s" % (at1 * 1000, n, med(f["atn"]) * 1000, med(f["atn"]) / at1,
                                  n - ROUNDS, f["up"], f["served"], f["down"]))
    print("  edgelinkd's CPU while the %d were ADDed: %.2f ms per ADD"
          % (n - ROUNDS, f["up_cpu"] * 1000 / (n - ROUNDS)))
    at1s = med(f["at1_stopped"])
    print("  the same with edgelinkd stopped (SIGSTOP): at 1 %.1f ms, at %d %.1f ms (%.2fx)"
          % (at1s * 1000, n, med(f["atn_stopped"]) * 1000, med(f["atn_stopped"]) / at1s))
    warm = med(f["at1_warm"])
    print("  ADD at %d in a burst (%d one after another, each pass beside the next ADD):"
          " %.1f ms (%.2fx ADD at 1 in ADD/DEL one after another, %.1f ms)"
          % (n, ROUNDS, med(f["burst"]) * 1000, med(f["burst"]) / warm, warm * 1000))
    k, wire, whole = f["hook"]
    if k:
        print("  webhook: %d reports while sampling, %.2f MB each on the wire (%.2f MB of JSON)"
              % (k, wire / k / 1e6, whole / k / 1e6))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--attachments", type=int, default=500)
    ap.add_argument("--samples", type=int, default=10)
    ap.add_argument("--perf", default="")
    ap.add_argument("--strace", default="", help="strace -f -tt -T the last ADD (and one at 1) into FILE.N")
    a = ap.parse_args()
    if a.attachments <= ROUNDS:
        raise SystemExit("--attachments must be more than %d (the ADDs timed at N)" % ROUNDS)
    for b in (ELK, DAEMON):
        if not os.access(b, os.X_OK):
            raise SystemExit("%s missing: make static (or cargo build --release)" % b)
    made, procs, f = [], [], {}
    state = tempfile.mkdtemp(prefix="elkscale-")
    try:
        build_lab(a.attachments, state, made, procs)
        lab.enter(NODE)
        hook = Webhook()
        d = start_daemon(state, procs, hook)
        f["rss0"], f["fds0"] = proc(d.pid)
        add_all(a, d, state, f)
        time.sleep(3)
        r0 = (hook.reports, hook.wire, hook.json)
        sample(a, d, state, f)
        f["hook"] = (hook.reports - r0[0], hook.wire - r0[1], hook.json - r0[2])
        hook.close()
        t = time.perf_counter()
        for i in range(a.attachments):
            cni("DEL", state, i)
        f["down"] = time.perf_counter() - t
        report(a.attachments, f)
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()
