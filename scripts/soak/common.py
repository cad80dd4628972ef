"""What the soak (scripts/soak/) and chaos (scripts/chaos/) scenarios share:
a lab of their own (scripts/bench/lab.py's topology, named after the
scenario), edgelinkd started and restarted in its node netns, its RSS and
fds sampled every second, the state directory listed for leaks, /metrics and
/status read from inside the node netns, durations from the environment,
results as JSON and figures as PNG.

Every namespace, process and mount a scenario makes is removed when its
`Scenario` closes, also on an exception, Ctrl-C or SIGTERM. Nothing here
sends from the host netns: HTTP to the daemon goes to 127.0.0.1 of the node
netns, from a thread that entered it.
"""
import json
import os
import signal
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "scripts", "bench"))
# The binaries `make static` and `make bench-bins` build, unless the
# environment names others (the Makefile does).
HOST_RELEASE = os.path.join(ROOT, "target", os.uname().machine + "-unknown-linux-gnu", "release")
for var, name in (("EDGELINK_BIN", "edgelink"), ("EDGELINKD_BIN", "edgelinkd"), ("LOADGEN_BIN", "elk-loadgen")):
    if not os.environ.get(var) and os.path.exists(os.path.join(HOST_RELEASE, name)):
        os.environ[var] = os.path.join(HOST_RELEASE, name)

import lab  # noqa: E402  (scripts/bench/lab.py)
from lab import Procs, in_ns, listening, node_env, raise_nofile, sh, wait_for  # noqa: E402,F401

QUICK = os.environ.get("QUICK") == "1"
OUT = os.environ.get("SOAK_OUT", os.path.join(ROOT, "target", "soak"))
STATUS_PORT = 9320
DEVICE_PY = os.path.join(ROOT, "scripts", "bench", "device.py")


def seconds(name, default, quick):
    """A duration from the environment (NAME=seconds), else the default, or
    the QUICK=1 one."""
    v = os.environ.get(name)
    if v:
        return float(v)
    return float(quick if QUICK else default)


def interrupted(*_):
    raise KeyboardInterrupt("SIGTERM")


class Scenario:
    """One scenario's lab: tmp dir, processes, namespaces (lab.Lab's node,
    device, pod, second pod and client), cleanups; all undone on exit."""

    def __init__(self, name):
        self.name = name
        signal.signal(signal.SIGTERM, interrupted)
        raise_nofile()
        lab.use_tag("elk%s-%d" % (name[:6], os.getpid()))
        self.tmp = tempfile.mkdtemp(prefix="edgelink-%s-" % name)
        self.procs = Procs(self.tmp)
        self.lab = lab.Lab(self.tmp, self.procs)
        self.cleanups = []  # run last first
        self.daemon = None

    def __enter__(self):
        try:
            self.lab.build()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        if self.daemon is not None:
            self.daemon.stop()
        self.procs.stop_all()
        for fn in reversed(self.cleanups):
            try:
                fn()
            except Exception as e:  # keep cleaning
                print("%s: cleanup: %s" % (self.name, e), file=sys.stderr)
        self.lab.close()
        shutil.rmtree(self.tmp, ignore_errors=True)
        return False

    def add(self, ns, container, forwards, state=None, name="soak", extra=None):
        """A plugin ADD of net1 in `ns` (bridge on the device segment);
        returns (exit code, parsed stdout or the raw text)."""
        conf = {"cniVersion": "1.0.0", "name": name, "type": "edgelink", "mode": "bridge",
                "bridge": "edge0", "uplink": "uplink0", "stateDir": state or self.lab.state,
                "ipam": {"ranges": [[{"subnet": "172.17.16.0/24", "rangeStart": "172.17.16.200",
                                      "rangeEnd": "172.17.16.250"}]], "nodeName": "soak"},
                "forwards": forwards}
        conf.update(extra or {})
        return cni("ADD", conf, container, ns)

    def echo_device(self, port, kind="_idle-echo"):
        """A TCP echo on epoll (_idle-echo) or a UDP echo (_udp-echo) on the
        device, listening before this returns."""
        p = self.procs.start("device-%s-%d" % (kind.strip("_"), port), lab.DEV,
                             [sys.executable, DEVICE_PY, kind, lab.DEV_IP, str(port)])
        proto = "udp" if "udp" in kind else "tcp"
        wait_for("device %s %d" % (proto, port), lambda: listening(lab.DEV, port, proto), p, self.procs)
        return p

    def start_daemon(self, *args, state=None):
        self.daemon = Daemon(self.procs, state or self.lab.state, list(args))
        self.daemon.start()
        return self.daemon


def cni(cmd, conf, container, ns, ifname="net1", timeout=30, pod=None):
    """Run the plugin in the node netns as a runtime does (env + stdin);
    returns (exit code, parsed JSON stdout or its text, stderr). The pod's
    name is `pod`, else the container ID."""
    env = {"CNI_COMMAND": cmd, "CNI_CONTAINERID": container, "CNI_IFNAME": ifname,
           "CNI_NETNS": "/var/run/netns/" + ns if ns else "", "CNI_PATH": "/usr/lib/cni",
           "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=soak;K8S_POD_NAME=" + (pod or container),
           "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    node_env(env, conf)
    p = subprocess.run(["ip", "netns", "exec", lab.NODE, lab.PLUGIN], input=json.dumps(conf).encode(),
                       env=env, capture_output=True, timeout=timeout)
    out = p.stdout.decode(errors="replace")
    try:
        out = json.loads(out) if out.strip() else out
    except ValueError:
        pass
    return p.returncode, out, p.stderr.decode(errors="replace")


class Daemon:
    """edgelinkd in the node netns; restartable (kill -9 and start again,
    as a supervisor would)."""

    def __init__(self, procs, state, args):
        self.procs, self.state, self.args = procs, state, args
        self.p = None
        self.port = STATUS_PORT

    def start(self, timeout=15.0):
        sock = os.path.join(self.state, "edgelinkd.sock")
        if os.path.exists(sock):
            os.unlink(sock)  # a killed daemon's; the new one binds its own
        self.p = self.procs.start("edgelinkd", lab.NODE, [
            lab.DAEMON, "run", "--state-dir", self.state, "--status-addr", "127.0.0.1:%d" % self.port,
            "--log-level", os.environ.get("SOAK_LOG_LEVEL", "warn"), "--probe-interval", "0"] + self.args)
        wait_for("edgelinkd's control socket", lambda: os.path.exists(sock), self.p, self.procs, timeout)
        return self.p

    @property
    def pid(self):
        return self.p.pid

    def kill9(self):
        os.kill(self.p.pid, signal.SIGKILL)
        self.p.wait(timeout=10)
        self.p.log.close()
        self.procs.started.remove(self.p)

    def stop(self):
        if self.p is not None and self.p in self.procs.started:
            self.procs.stop(self.p)
            self.procs.started.remove(self.p)

    def http(self, path, timeout=5.0):
        def get():
            s = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
            try:
                s.sendall(("GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % path).encode())
                buf = b""
                while True:
                    b = s.recv(1 << 16)
                    if not b:
                        break
                    buf += b
            finally:
                s.close()
            head, _, body = buf.partition(b"\r\n\r\n")
            if b"chunked" in head.lower():
                body = dechunk(body)
            return body.decode(errors="replace")
        return in_ns(lab.NODE, get)

    def status(self):
        return json.loads(self.http("/status"))

    def metrics(self):
        """{metric name: sum over its labels} of /metrics."""
        out = {}
        for line in self.http("/metrics").splitlines():
            if not line or line.startswith("#"):
                continue
            name, _, value = line.rpartition(" ")
            name = name.split("{", 1)[0]
            try:
                out[name] = out.get(name, 0.0) + float(value)
            except ValueError:
                pass
        return out


def dechunk(body):
    out = b""
    while body:
        size, _, rest = body.partition(b"\r\n")
        n = int(size.split(b";")[0] or b"0", 16)
        if n == 0:
            break
        out += rest[:n]
        body = rest[n + 2:]
    return out


def rss_kb(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def fd_count(pid):
    try:
        return len(os.listdir("/proc/%d/fd" % pid))
    except OSError:
        return None


# edgelinkd keeps up to 256 idle splice pipes (2 fds each) for reuse.
PIPE_POOL_FDS = 512


def fds_but_pipes(pid):
    """(fds that are not pipes, pipe fds) of a process: a relay's idle
    pipes stay pooled (up to PIPE_POOL_FDS fds), everything else must come
    back to where it was."""
    other = pipes = 0
    try:
        for fd in os.listdir("/proc/%d/fd" % pid):
            try:
                if os.readlink("/proc/%d/fd/%s" % (pid, fd)).startswith("pipe:"):
                    pipes += 1
                else:
                    other += 1
            except OSError:
                pass
    except OSError:
        return None, None
    return other, pipes


def fd_leak(before, after):
    """Whether fds leaked between two fds_but_pipes() readings."""
    return after[0] != before[0] or after[1] > PIPE_POOL_FDS


class Background:
    """A `run` method on a thread while in a `with` block; `run` ends when
    `stop_ev` is set. `netns`: the namespace the thread runs in."""

    def __init__(self, netns=None):
        self.stop_ev = threading.Event()
        target = self.run if netns is None else (lambda: in_ns(netns, self.run))
        self.th = threading.Thread(target=target, daemon=True)

    def __enter__(self):
        self.th.start()
        return self

    def __exit__(self, *exc):
        self.stop_ev.set()
        self.th.join()

    def run(self):
        raise NotImplementedError


class Sampler(Background):
    """(seconds since start, RSS KiB, fds) of a process every `every`
    seconds on a thread; `pid` is a callable, so a restarted daemon is
    followed."""

    def __init__(self, pid, every=1.0):
        self.pid, self.every = pid, every
        self.t0 = time.monotonic()
        self.samples = []
        super().__init__()

    def now(self):
        return time.monotonic() - self.t0

    def run(self):
        nxt = time.monotonic()
        while not self.stop_ev.is_set():
            pid = self.pid()
            r, f = rss_kb(pid), fd_count(pid)
            if r is not None:
                self.samples.append((self.now(), r, f))
            nxt += self.every
            self.stop_ev.wait(max(0.0, nxt - time.monotonic()))

    def at(self, t):
        """The last sample at or before t (seconds since start)."""
        best = None
        for s in self.samples:
            if s[0] <= t:
                best = s
        return best or (self.samples[0] if self.samples else None)


def slope_kb_per_min(points):
    """Least-squares slope of [(seconds, KiB)], in KiB per minute."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    if sxx == 0:
        return 0.0
    return sum((p[0] - mx) * (p[1] - my) for p in points) / sxx * 60.0


# What stays in a state dir by design once the first ADD made it: the
# daemon's socket, each IPAM store's lock and its last-reserved cursor,
# the plugin's per-bridge lock (locks/bridge-NAME.lock),
# and its sticky memory (sticky/NS_POD_IFNAME: the address a pod name held
# last, forgotten after 7 days; counted apart by sticky_count).
KEPT = ("edgelinkd.sock", "lock", "last_reserved_ip.", "bridge-")


def second_half_slope(points):
    """slope_kb_per_min over the later half of [(seconds, KiB)]: whether
    the growth has stopped."""
    return slope_kb_per_min(points[len(points) // 2:])


def keep_log(p, name, pattern=("ERROR", "WARN", "reset", "error")):
    """Lines of process p's log that match, to OUT/NAME.log (500 at most):
    the tmp dir goes at the end."""
    try:
        p.log.flush()
        with open(p.log.name, errors="replace") as f:
            lines = [l for l in f if any(w in l for w in pattern)]
    except (OSError, ValueError):
        return None
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, name + ".log")
    with open(path, "w") as f:
        f.writelines(lines[:500])
    return path


def state_listing(state):
    """The files under the state dir (relative paths): attachment records,
    IPAM reservations and owner indexes, temp files; less what is kept by
    design (KEPT, sticky/)."""
    out = []
    for root, _, files in os.walk(state):
        if os.path.basename(root) == "sticky":
            continue
        for n in files:
            if not n.startswith(KEPT):
                out.append(os.path.relpath(os.path.join(root, n), state))
    return sorted(out)


def sticky_count(state):
    return sum(len(files) for root, _, files in os.walk(state) if os.path.basename(root) == "sticky")


def links(ns):
    """The links of netns `ns`, less the bridge edge0, which the first ADD
    makes and every later one reuses (kept by design, as the reference
    bridge plugin keeps its bridge)."""
    p = sh("ip", "-n", ns, "-o", "link", "show", check=False)
    return sorted(n for n in (l.split(": ")[1].split("@")[0] for l in p.stdout.splitlines() if ": " in l)
                  if n != "edge0")


def save(name, result):
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, name + ".json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    return path


def figure_path(name):
    """Figures go to $SOAK_FIGURES (docs/figures in `make soak`/`make chaos`),
    else next to the results."""
    d = os.environ.get("SOAK_FIGURES") or OUT
    os.makedirs(d, exist_ok=True)
    return os.path.join(d, name + ".png")


def pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams.update({"font.size": 8, "figure.dpi": 90})
    return plt


def rss_figure(name, title, sampler, marks=(), spans=(), extra=None):
    """RSS (MiB, left) and fds (right) of the sampled process over time;
    `marks` [(t, label)] are vertical lines, `spans` [(t0, t1, label)]
    shaded; `extra(ax)` may draw more on the RSS axis."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.2))
    t = [s[0] for s in sampler.samples]
    ax.plot(t, [s[1] / 1024.0 for s in sampler.samples], color="tab:blue", lw=1, label="RSS (MiB)")
    ax.set_xlabel("seconds")
    ax.set_ylabel("edgelinkd RSS (MiB)", color="tab:blue")
    ax.set_ylim(0, max([s[1] / 1024.0 for s in sampler.samples] + [1.0]) * 1.3)
    ax2 = ax.twinx()
    ax2.plot(t, [s[2] or 0 for s in sampler.samples], color="tab:orange", lw=0.8, label="fds")
    ax2.set_ylabel("edgelinkd fds", color="tab:orange")
    ax2.set_ylim(0, max([s[2] or 0 for s in sampler.samples] + [1]) * 1.15)
    for x, label in marks:
        ax.axvline(x, color="grey", lw=0.6, ls=":")
    for a, b, label in spans:
        ax.axvspan(a, b, color="tab:red", alpha=0.1, label=label)
    if extra:
        extra(ax)
    ax.set_title(title)
    fig.tight_layout()
    path = figure_path(name)
    fig.savefig(path)
    plt.close(fig)
    return path


def table(title, rows):
    """Print rows [(figure, value)] as a Markdown table; returns its text."""
    lines = ["%s" % title, "", "| figure | value |", "|---|---|"]
    lines += ["| %s | %s |" % (k, v) for k, v in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    return text


def wait_until(cond, timeout, step=0.05):
    """Poll cond() until it holds or `timeout` passes; returns the seconds
    it took, or None."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if cond():
            return time.monotonic() - t0
        time.sleep(step)
    return None


class ConnLoad(Background):
    """elk-loadgen conn-rate (connect, 64 bytes each way, close) from the
    client netns in slices of `slice_s`, on a thread: `timeline` is
    [(t0, t1, connections, failed)] on the sampler's clock."""

    def __init__(self, clock, addr, concurrency=4, slice_s=1.0):
        self.clock, self.addr, self.c, self.slice = clock, addr, concurrency, slice_s
        self.timeline = []
        super().__init__()

    def run(self):
        while not self.stop_ev.is_set():
            t0 = self.clock()
            try:
                r = lab.run_json(lab.CLIENT, [lab.LOADGEN, "conn-rate", self.addr, "--concurrency", str(self.c),
                                              "--seconds", str(self.slice)], self.slice + 30)
                self.timeline.append((t0, self.clock(), r["connections"], r["failed"]))
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                self.timeline.append((t0, self.clock(), 0, -1))
                print("load: %s" % e, file=sys.stderr)

    def totals(self):
        return (sum(x[2] for x in self.timeline), sum(x[3] for x in self.timeline if x[3] > 0))


class Held(Background):
    """`n` TCP connections held through a forward from the client netns,
    each echoing 16 bytes every `every` seconds; one that fails is counted
    in `lost` (with the time) and opened again."""

    def __init__(self, clock, host, port, n=20, every=0.5):
        self.clock, self.host, self.port, self.n, self.every = clock, host, port, n, every
        self.lost, self.reconnects_failed = [], 0
        super().__init__(lab.CLIENT)

    def _open(self):
        try:
            s = socket.create_connection((self.host, self.port), timeout=1.0)
            s.settimeout(2.0)
            return s
        except OSError:
            self.reconnects_failed += 1
            return None

    def run(self):
        socks = [self._open() for _ in range(self.n)]
        while not self.stop_ev.wait(self.every):
            for i, s in enumerate(socks):
                if s is None:
                    socks[i] = self._open()
                    continue
                try:
                    s.sendall(b"h" * 16)
                    got = b""
                    while len(got) < 16:
                        b = s.recv(16 - len(got))
                        if not b:
                            raise OSError("closed")
                        got += b
                except OSError:
                    self.lost.append(self.clock())
                    s.close()
                    socks[i] = self._open()
        for s in socks:
            if s is not None:
                s.close()


def run_all(here, names):
    """Run each scenario `here`/NAME.py (ONLY=a,b picks some) as its own
    process, in order; print one line per scenario; exit status 1 if any
    failed its checks."""
    only = [n for n in os.environ.get("ONLY", "").split(",") if n]
    results = []
    for name in names:
        if only and name not in only:
            continue
        print("== %s" % name, flush=True)
        t0 = time.monotonic()
        rc = subprocess.call([sys.executable, os.path.join(here, name + ".py")])
        results.append((name, rc, time.monotonic() - t0))
    print()
    for name, rc, dt in results:
        print("%-18s %s (%.0f s)" % (name, "ok" if rc == 0 else "FAILED (exit %d)" % rc, dt))
    return 1 if any(rc for _, rc, _ in results) else 0


def fmt_fds(f):
    """A fds_but_pipes() reading as '40' or '44 (4 pooled pipe fds)'."""
    if f is None or f[0] is None:
        return "?"
    return "%d" % f[0] if not f[1] else "%d (+%d pooled pipe fds)" % (f[0], f[1])
