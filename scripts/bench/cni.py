#!/usr/bin/env python3
"""CNI benchmark: edgelink against the reference plugins, side by side.

Subjects (each pair alternates A B A B within every round, so machine drift
hits both alike):
  edgelink bridge  vs  reference bridge  + host-local
  edgelink macvlan vs  reference macvlan + host-local

Figures: ADD / CHECK / DEL latency (median, p95) sequentially and with 8 in
parallel; the time to bring up and tear down many attachments on one bridge;
ADD latency with an empty pool and with 5000 existing reservations.

The harness switches itself into a "node" namespace it creates (as a
runtime runs plugins in the host namespace), so a plugin start is a plain
fork+exec. Everything lives in namespaces it creates and removes.

    cni.py [--quick] [--out FILE]
"""
import argparse
import ctypes
import json
import os
import signal
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import verdict  # scripts/bench/verdict.py: which failures fail the run

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ELK = os.environ.get("EDGELINK_BIN", os.path.join(ROOT, "target/release/edgelink"))
FILL = os.environ.get("FILL_BIN", os.path.join(ROOT, "target/release/examples/fill_store"))
DAEMON = os.environ.get("EDGELINKD_BIN", os.path.join(ROOT, "target/release/edgelinkd"))
REF = "/usr/lib/cni"
TAG = "elkbench-%d" % os.getpid()
NODE = TAG + "-node"
libc = ctypes.CDLL("libc.so.6", use_errno=True)
CLONE_NEWNET = 0x40000000
# Subject name -> error outputs of its failed CHECKs (the edgelink ones fail
# the run at the end, verdict.cni_checks).
CHECK_FAILURES = {}


def sh(*args, check=True):
    return subprocess.run(args, check=check, capture_output=True, text=True)


def setns(name):
    fd = os.open("/var/run/netns/" + name, os.O_RDONLY)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns " + name)
    os.close(fd)


class Lab:
    def __init__(self, pods):
        self.netns = []
        self.add(NODE)
        self.add(TAG + "-dev")
        for i in (0, 1):
            sh("ip", "-n", NODE, "link", "add", "uplink%d" % i, "type", "veth",
               "peer", "name", "port%d" % i, "netns", TAG + "-dev")
            sh("ip", "-n", NODE, "link", "set", "uplink%d" % i, "up")
            sh("ip", "-n", TAG + "-dev", "link", "set", "port%d" % i, "up")
        self.pods = [self.add("%s-pod%d" % (TAG, i)) for i in range(pods)]

    def add(self, name):
        sh("ip", "netns", "del", name, check=False)
        sh("ip", "netns", "add", name)
        sh("ip", "-n", name, "link", "set", "lo", "up")
        self.netns.append(name)
        return name

    def close(self):
        for n in reversed(self.netns):
            sh("ip", "netns", "del", n, check=False)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


def fmt_ms(x):
    return "%.2f" % (x * 1000)


def node_env(env, conf):
    """EDGELINK_STATE_DIR for edgelink: the config's stateDir, as root sets
    it for a node's runtime, with the lab's node policy (its uplinks) there
    (docs/configuration.md, "The node decides")."""
    state = conf.get("stateDir")
    if not state:
        return
    env["EDGELINK_STATE_DIR"] = state
    path = os.path.join(state, "node-policy.json")
    if not os.path.exists(path):
        os.makedirs(state, exist_ok=True)
        with open(path, "w") as f:
            f.write('{"uplinks": ["uplink0", "uplink1"]}\n')


class Subject:
    def __init__(self, name, binary, conf):
        self.name, self.binary, self.conf = name, binary, conf

    def run(self, cmd, cid, pod, ifname="net1", conf=None, may_fail=False):
        env = {"CNI_COMMAND": cmd, "CNI_CONTAINERID": cid, "CNI_IFNAME": ifname,
               "CNI_NETNS": "/var/run/netns/" + pod if pod else "",
               "CNI_PATH": REF, "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=" + cid,
               "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
        node_env(env, conf or self.conf)
        data = json.dumps(conf or self.conf).encode()
        t = time.perf_counter()
        p = subprocess.run([self.binary], input=data, env=env, capture_output=True)
        dt = time.perf_counter() - t
        if p.returncode != 0 and may_fail:
            CHECK_FAILURES.setdefault(self.name, []).append(
                (p.stdout.decode(errors="replace") + p.stderr.decode(errors="replace")).strip())
        elif p.returncode != 0:
            raise SystemExit("%s %s %s failed: %s %s" % (self.name, cmd, cid, p.stdout, p.stderr))
        return dt, p.stdout

    def cycle(self, cid, pod, ifname="net1"):
        """ADD, CHECK (with prevResult), DEL; returns the three latencies."""
        a, out = self.run("ADD", cid, pod, ifname)
        conf = dict(self.conf)
        conf["prevResult"] = json.loads(out)
        # The reference bridge's CHECK compares the bridge's MAC, which
        # changes as ports come and go: under parallel load it fails. Count
        # CHECK failures instead of stopping: the reference's are reported,
        # edgelink's fail the run once the figures are written.
        c, _ = self.run("CHECK", cid, pod, ifname, conf, may_fail=True)
        d, _ = self.run("DEL", cid, pod, ifname, conf)
        return a, c, d


def start_daemon(state_dir):
    """edgelinkd in the node netns (the harness is in it already), as on a
    deployed node: DEL hands the pod's interface to it."""
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    p = subprocess.Popen([DAEMON, "run", "--state-dir", state_dir, "--status-addr", "127.0.0.1:9311",
                          "--log-level", "warn", "--probe-interval", "0"],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    sock = os.path.join(state_dir, "edgelinkd.sock")
    deadline = time.time() + 10
    while not os.path.exists(sock):
        if p.poll() is not None or time.time() > deadline:
            p.kill()
            raise SystemExit("edgelinkd did not start: %s" % p.stderr.read().decode(errors="replace")[-500:])
        time.sleep(0.02)
    return p


def without_daemon(pair, state):
    """The edgelink subject of `pair` with a state dir no daemon serves
    (DEL deletes the link itself), beside the same reference."""
    elk, ref = pair
    conf = dict(elk.conf, stateDir=os.path.join(state, "edgelink-no-daemon"))
    return (Subject(elk.name + ", no daemon", elk.binary, conf), ref)


def subjects(state):
    def ipam(subnet, kind):
        r = {"ranges": [[{"subnet": subnet}]]}
        if kind == "host-local":
            r.update({"type": "host-local", "dataDir": os.path.join(state, "host-local")})
        else:
            r["nodeName"] = "bench"
        return r
    base = {"cniVersion": "1.0.0"}
    elk_dir = os.path.join(state, "edgelink")
    return [
        (Subject("edgelink bridge", ELK, dict(base, name="elk-br", type="edgelink", mode="bridge",
                 bridge="elkbr0", uplink="uplink0", stateDir=elk_dir, ipam=ipam("10.10.0.0/16", "edgelink"))),
         Subject("reference bridge + host-local", REF + "/bridge", dict(base, name="ref-br", type="bridge",
                 bridge="refbr0", ipam=ipam("10.11.0.0/16", "host-local")))),
        (Subject("edgelink macvlan", ELK, dict(base, name="elk-mv", type="edgelink", mode="macvlan",
                 uplink="uplink1", stateDir=elk_dir, ipam=ipam("10.12.0.0/16", "edgelink"))),
         Subject("reference macvlan + host-local", REF + "/macvlan", dict(base, name="ref-mv", type="macvlan",
                 master="uplink1", mode="bridge", ipam=ipam("10.13.0.0/16", "host-local")))),
    ]


def sequential(pair, lab, rounds):
    res = {s.name: {"ADD": [], "CHECK": [], "DEL": []} for s in pair}
    for r in range(rounds):
        order = pair if r % 2 == 0 else pair[::-1]
        for s in order:
            a, c, d = s.cycle("seq-%d" % r, lab.pods[r % len(lab.pods)])
            res[s.name]["ADD"].append(a)
            res[s.name]["CHECK"].append(c)
            res[s.name]["DEL"].append(d)
    return res


def parallel(pair, lab, rounds, width=8):
    res = {s.name: {"ADD": [], "CHECK": [], "DEL": []} for s in pair}
    per = max(1, (rounds + width - 1) // width)
    for r in range(per):
        order = pair if r % 2 == 0 else pair[::-1]
        for s in order:
            errors = []

            def worker(w):
                try:
                    a, c, d = s.cycle("par-%d-%d" % (r, w), lab.pods[w])
                    res[s.name]["ADD"].append(a)
                    res[s.name]["CHECK"].append(c)
                    res[s.name]["DEL"].append(d)
                except BaseException as e:  # report, don't hang
                    errors.append(e)
            ts = [threading.Thread(target=worker, args=(w,)) for w in range(width)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            if errors:
                raise SystemExit("parallel %s: %s" % (s.name, errors[0]))
    return res


def scale(pair, lab, count):
    """Bring up `count` attachments on one bridge, then tear them down."""
    out = {}
    per_pod = (count + len(lab.pods) - 1) // len(lab.pods)
    slots = [(lab.pods[i // per_pod], "net%d" % (i % per_pod)) for i in range(count)]
    for s in pair:
        t = time.perf_counter()
        for i, (pod, ifn) in enumerate(slots):
            s.run("ADD", "scale-%d" % i, pod, ifn)
        up = time.perf_counter() - t
        t = time.perf_counter()
        for i, (pod, ifn) in enumerate(slots):
            s.run("DEL", "scale-%d" % i, pod, ifn)
        out[s.name] = (up, time.perf_counter() - t)
    return out


def fill_host_local(state, network, subnet_prefix, n):
    d = os.path.join(state, "host-local", network)
    os.makedirs(d, exist_ok=True)
    for i in range(n):
        ip = "%s.%d.%d" % (subnet_prefix, 1 + (i + 1) // 256, (i + 1) % 256)
        with open(os.path.join(d, ip), "w") as f:
            f.write("fill-%d\r\nnet1" % i)
    with open(os.path.join(d, "last_reserved_ip.0"), "w") as f:
        f.write("%s.%d.%d" % (subnet_prefix, 1 + n // 256, n % 256))


def pool_scaling(pair, lab, state, rounds, fill):
    elk, ref = pair
    out = {}
    for label, n in (("empty pool", 0), ("%d reservations" % fill, fill)):
        if n:
            subprocess.run([FILL, elk.conf["stateDir"], elk.conf["name"], json.dumps(elk.conf["ipam"]), str(n)], check=True)
            fill_host_local(state, ref.conf["name"], "10.11", n)
        times = {elk.name: [], ref.name: []}
        for r in range(rounds):
            for s in (pair if r % 2 == 0 else pair[::-1]):
                a, _ = s.run("ADD", "pool-%s-%d" % (n, r), lab.pods[r % len(lab.pods)])
                times[s.name].append(a)
                s.run("DEL", "pool-%s-%d" % (n, r), lab.pods[r % len(lab.pods)])
        out[label] = times
    return out


def machine():
    cpu = "unknown"
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return "%s, %d cores, kernel %s" % (cpu, os.cpu_count(), os.uname().release)


def interrupted(*_):
    raise KeyboardInterrupt("SIGTERM")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="one short round (CI)")
    ap.add_argument("--out", help="write the markdown section here")
    a = ap.parse_args()
    rounds, scale_n, fill_n, pool_rounds = (8, 24, 200, 6) if a.quick else (120, 500, 5000, 40)
    for b in (ELK, FILL, REF + "/bridge", REF + "/macvlan", REF + "/host-local"):
        if not os.path.exists(b):
            raise SystemExit("missing %s (make bench builds and installs everything)" % b)

    # SIGTERM (CI timeouts, Ctrl-C of make) unwinds through the finally
    # below, which removes the namespaces.
    signal.signal(signal.SIGTERM, interrupted)
    state = tempfile.mkdtemp(prefix="edgelink-bench-")
    lab = Lab(pods=max(16, (scale_n + 9) // 10 if scale_n > 160 else 16))
    started = time.time()
    daemon = None
    try:
        setns(NODE)
        pairs = subjects(state)
        daemon = start_daemon(pairs[0][0].conf["stateDir"])
        seq = [sequential(p, lab, rounds) for p in pairs]
        seq_nd = [sequential(without_daemon(p, state), lab, rounds) for p in pairs]
        par = [parallel(p, lab, rounds) for p in pairs]
        sc = scale(pairs[0], lab, scale_n)
        pool = pool_scaling(pairs[0], lab, state, pool_rounds, fill_n)
    finally:
        if daemon is not None:
            daemon.terminate()
            try:
                daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                daemon.kill()
        lab.close()
        shutil.rmtree(state, ignore_errors=True)

    lines = []
    w = lines.append
    w("## CNI: edgelink against the reference plugins")
    w("")
    w("Measured %s on %s, `%s`, %d rounds, subjects alternating within each round; "
      "latency of one plugin run (fork+exec to exit) from a harness inside the node namespace. "
      "edgelinkd runs in the node namespace as on a deployed node, so edgelink's DEL strips the pod's "
      "interface of its addresses, marks it retired and hands it to the daemon, which deletes it in the "
      "background (the kernel takes 15–40 ms to delete a link); \"no daemon\" is the same plugin with a "
      "state directory no daemon serves: it deletes the link itself, as the reference plugins do."
      % (time.strftime("%Y-%m-%d"), machine(), "make bench" + (" QUICK=1" if a.quick else ""), rounds))
    w("")
    for title, data in (("sequential", seq), ("sequential, no daemon", seq_nd), ("8 in parallel", par)):
        w("### ADD / CHECK / DEL, %s (ms)" % title)
        w("")
        w("| subject | ADD median | ADD p95 | CHECK median | CHECK p95 | DEL median | DEL p95 |")
        w("|---|---|---|---|---|---|---|")
        for res in data:
            for name, r in res.items():
                w("| %s | %s | %s | %s | %s | %s | %s |" % (name, fmt_ms(statistics.median(r["ADD"])), fmt_ms(pct(r["ADD"], 95)),
                  fmt_ms(statistics.median(r["CHECK"])), fmt_ms(pct(r["CHECK"], 95)),
                  fmt_ms(statistics.median(r["DEL"])), fmt_ms(pct(r["DEL"], 95))))
        w("")
        w("| ratio edgelink / reference | ADD median | CHECK median | DEL median |")
        w("|---|---|---|---|")
        for res in data:
            (en, e), (rn, rr) = list(res.items())
            w("| %s | %.2f× | %.2f× | %.2f× |" % (en.replace("edgelink ", "", 1), statistics.median(e["ADD"]) / statistics.median(rr["ADD"]),
              statistics.median(e["CHECK"]) / statistics.median(rr["CHECK"]),
              statistics.median(e["DEL"]) / statistics.median(rr["DEL"])))
        w("")
    # The CNI targets, from the sequential runs with the daemon.
    w("Targets (issue 4), sequential medians with the daemon:")
    w("")
    for res in seq:
        (en, e), (rn, rr) = list(res.items())
        add = statistics.median(e["ADD"]) / statistics.median(rr["ADD"])
        dele = statistics.median(e["DEL"]) / statistics.median(rr["DEL"])
        w("- %s: ADD %.2f× (≤ 0.3×: %s), DEL %.2f× (≤ 0.5×: %s)" % (
            en, add, "met" if add <= 0.3 else "missed", dele, "met" if dele <= 0.5 else "missed"))
    w("")
    w("### %d attachments on one bridge (s)" % scale_n)
    w("")
    w("| subject | bring up | tear down |")
    w("|---|---|---|")
    for name, (up, down) in sc.items():
        w("| %s | %.2f | %.2f |" % (name, up, down))
    w("")
    w("### ADD latency and the size of the pool (ms, median of %d)" % pool_rounds)
    w("")
    w("| pool | %s |" % " | ".join(pool[list(pool)[0]].keys()))
    w("|---|---|---|")
    for label, t in pool.items():
        w("| %s | %s |" % (label, " | ".join(fmt_ms(statistics.median(v)) for v in t.values())))
    w("")
    failed, notes = verdict.cni_checks(CHECK_FAILURES)
    lines.extend(verdict.section("Checks: edgelink's CHECK passes", failed, notes))
    w("Run time: %.0f s." % (time.time() - started))
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    if failed:
        raise SystemExit("cni bench: FAILED: " + "; ".join(failed))


if __name__ == "__main__":
    main()
