"""The fragile device: a device with a listen backlog of 5 that accepts one
connection every 5 ms, like an embedded TCP stack, and a burst of clients
that all connect at once (issue: a burst of 200 through edgelinkd completed
138 to 198 of 200; HAProxy with `maxconn 16` on its server line and a queue
completed 200/200).

Subjects: the direct routed path (every client's SYN reaches the device),
HAProxy with `maxconn 16` on the server line and `timeout queue`, and
edgelinkd with a forward of `maxConnections: 16`, `queueTimeoutMs` and
`connectRetries` (clients beyond the bound wait in its FIFO queue). The device and HAProxy are
started here when the measure runs; edgelinkd's forward is part of the lab's
plugin ADD (forward() below). verdict.py fails the run when edgelinkd does
not complete every client of a burst.
"""
import glob
import json
import os
import subprocess
import time

from lab import CLIENT, DEV, DEV_IP, LOADGEN, POD, POD_IP, in_ns, listening, run_json, tcp_echo_once, wait_for, works
from report import cell, fmt
from subjects import Subject

PORT = 7003  # the device's port
ELK_PORT, HAPROXY_PORT = 15003, 16003
BACKLOG, ACCEPT_EVERY_MS = 5, 5
MAX_CONNECTIONS = 16
QUEUE_TIMEOUT_MS = 30000
CONNECT_RETRIES = 3
# (clients, the burst's timeout in seconds): at one accept per 5 ms the
# device needs 1 s for 200 connections and 5 s for 1000; the rest is room
# for SYN retransmissions on the direct path (1 s, 3 s, 7 s, 15 s).
BURSTS = [(200, 20), (1000, 30)]
# CI: the 200 burst once, with a shorter bound (the relays need ~1.5 s; only
# the direct path waits it out).
QUICK_BURSTS = [(200, 10)]
SIZE = 64
QUEUE_KEYS = ("maxConnections", "queueTimeoutMs", "connectRetries")


def forward():
    """edgelinkd's forward to the device, with the keys of its queue."""
    return {"name": "fragile", "protocol": "tcp", "port": ELK_PORT, "target": "%s:%d" % (DEV_IP, PORT),
            "maxConnections": MAX_CONNECTIONS, "queueTimeoutMs": QUEUE_TIMEOUT_MS, "connectRetries": CONNECT_RETRIES}


def recorded(state):
    """The fragile forward as the plugin recorded it for edgelinkd (the
    attachment records under the state dir), or None."""
    for path in glob.glob(os.path.join(state, "**", "*.json"), recursive=True):
        try:
            with open(path) as f:
                rec = json.load(f)
        except (OSError, ValueError):
            continue
        for fw in (rec.get("forwards") or []) if isinstance(rec, dict) else []:
            if isinstance(fw, dict) and fw.get("name") == "fragile":
                return fw
    return None


def in_flight():
    """Connections on the device's port that are not LISTEN or TIME_WAIT,
    in the device netns."""
    def read():
        n = 0
        with open("/proc/thread-self/net/tcp") as f:
            next(f)
            for line in f:
                c = line.split()
                if int(c[1].rsplit(":", 1)[1], 16) == PORT and c[3] not in ("0A", "06"):
                    n += 1
        return n
    return in_ns(DEV, read)


def settle(timeout=20.0):
    """Wait (bounded) until the last burst's connections to the device are
    gone, so that the next subject meets an idle device."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and in_flight():
        time.sleep(0.1)
    time.sleep(0.3)


def start_haproxy(procs, tmp):
    cfg = ["global", "    maxconn 4096",
           "defaults", "    mode tcp", "    maxconn 4096", "    timeout connect 5s", "    retries 3",
           "    timeout client 1m", "    timeout server 1m", "    timeout queue %ds" % (QUEUE_TIMEOUT_MS // 1000),
           "listen fragile", "    bind %s:%d" % (POD_IP, HAPROXY_PORT),
           "    server dev %s:%d maxconn %d" % (DEV_IP, PORT, MAX_CONNECTIONS)]
    path = os.path.join(tmp, "haproxy-fragile.cfg")
    with open(path, "w") as f:
        f.write("\n".join(cfg) + "\n")
    p = procs.start("haproxy-fragile", POD, ["haproxy", "-f", path, "-db"])
    return Subject("HAProxy maxconn %d" % MAX_CONNECTIONS, POD_IP, {PORT: HAPROXY_PORT}, [p],
                   ["haproxy -f haproxy-fragile.cfg -db  # %s" % "; ".join(l.strip() for l in cfg)])


def start(procs, tmp, daemon, forwards, with_haproxy, budget_s):
    """The device (for at most budget_s), then the subjects, each checked
    with one echo through it."""
    dev = procs.start("fragile-device", DEV, [
        LOADGEN, "fragile-device", "%s:%d" % (DEV_IP, PORT), "--backlog", str(BACKLOG),
        "--accept-every-ms", str(ACCEPT_EVERY_MS), "--seconds", "%d" % budget_s])
    wait_for("the fragile device on tcp port %d" % PORT, lambda: listening(DEV, PORT), dev, procs)
    fw = next(f for f in forwards if f["name"] == "fragile")
    subjects = [Subject("direct", DEV_IP, {PORT: PORT}, commands=[
        "client -> %s:%d via the pod (routed, no relay)" % (DEV_IP, PORT)], peer=False)]
    if with_haproxy:
        subjects.append(start_haproxy(procs, tmp))
    subjects.append(Subject("edgelinkd", POD_IP, {PORT: ELK_PORT}, [daemon],
                            ["plugin ADD: forward %s" % json.dumps(fw, sort_keys=True)], peer=False))
    for s in subjects:
        owner = s.procs[0] if s.procs else dev
        wait_for("%s: an echo from the fragile device through it" % s.name,
                 lambda: works(CLIENT, tcp_echo_once, s.host, s.ports[PORT]), owner, procs)
    settle()
    return subjects


def burst(s, clients, timeout_s):
    r = run_json(CLIENT, [LOADGEN, "burst", "%s:%d" % (s.host, s.ports[PORT]), "--clients", str(clients),
                          "--size", str(SIZE), "--timeout-s", str(timeout_s)], timeout_s + 30)
    k = "fragile%d_" % clients
    out = {k + "completed": r["completed"], k + "seconds": r["seconds"]}
    if r["completed"]:
        out.update({k + "p50_ms": r["p50_ms"], k + "p99_ms": r["p99_ms"], k + "max_ms": r["max_ms"]})
    return out, r.get("errors") or {}


def run(procs, tmp, daemon, forwards, with_haproxy, rounds, quick, results, errors):
    """The bursts, each size through each subject (alternating, the order
    rotating every round); figures into results[subject], failed
    measurements into errors. Returns (subjects, failures by kind)."""
    bursts = QUICK_BURSTS if quick else BURSTS
    n = 1 if quick else rounds
    budget = 120 + n * sum(t + 30 for _, t in bursts) * 3
    subjects = start(procs, tmp, daemon, forwards, with_haproxy, budget)
    kinds = {}
    for r in range(n):
        for clients, timeout_s in bursts:
            k = r % len(subjects)
            line = []
            for s in subjects[k:] + subjects[:k]:
                try:
                    got, why = burst(s, clients, timeout_s)
                except (RuntimeError, subprocess.TimeoutExpired, OSError, KeyError, ValueError) as e:
                    errors.append("round %d, fragile device, burst of %d, %s: %s"
                                  % (r + 1, clients, s.name, str(e)[:300]))
                    print("  FAILED: " + errors[-1], flush=True)
                    settle()
                    continue
                for key, v in got.items():
                    results.setdefault(s.name, {}).setdefault(key, []).append(v)
                for kind, c in why.items():
                    kk = kinds.setdefault((s.name, clients), {})
                    kk[kind] = kk.get(kind, 0) + c
                line.append("%s %d/%d p99=%s ms%s" % (
                    s.name, got["fragile%d_completed" % clients], clients,
                    fmt("%.0f", got.get("fragile%d_p99_ms" % clients)),
                    " (%s)" % ", ".join("%s %d" % kv for kv in sorted(why.items())) if why else ""))
                settle()
            print("round %d fragile device, burst of %d: %s" % (r + 1, clients, "; ".join(line)), flush=True)
    return subjects, kinds


def section(subjects, results, kinds, quick, rounds, rec):
    """The Markdown of the fragile-device measure; `rec` is the forward as
    the plugin recorded it for edgelinkd (recorded())."""
    lines = []
    w = lines.append
    bursts = QUICK_BURSTS if quick else BURSTS
    n = 1 if quick else rounds
    w("### Fragile device: bursts against a backlog of %d and one accept per %d ms" % (BACKLOG, ACCEPT_EVERY_MS))
    w("")
    w("The device (`elk-loadgen fragile-device %s:%d --backlog %d --accept-every-ms %d`) listens with a "
      "backlog of %d and accepts one connection every %d ms, each an echo on its own thread, like an "
      "embedded TCP stack. `elk-loadgen burst HOST:PORT --clients N --size %d --timeout-s T` starts N "
      "clients at once (a barrier); each connects, sends %d bytes, reads them back and closes, within T "
      "seconds of the start. Completion time: from the start of the burst to that client's echo. "
      "Bursts of %s, %d time%s each, the subjects alternating; between two bursts the device is "
      "left to drain."
      % (DEV_IP, PORT, BACKLOG, ACCEPT_EVERY_MS, BACKLOG, ACCEPT_EVERY_MS, SIZE, SIZE,
         " and ".join("%d (T = %d s)" % b for b in bursts), n, "" if n == 1 else "s"))
    w("")
    w("| subject | clients | completed (each run) | p50 ms | p99 ms | max ms | failures, by kind (all runs) |")
    w("|---|---|---|---|---|---|---|")
    for clients, _ in bursts:
        k = "fragile%d_" % clients
        for s in subjects:
            r = results.get(s.name, {})
            done = r.get(k + "completed", [])
            why = kinds.get((s.name, clients), {})
            w("| %s | %d | %s | %s | %s | %s | %s |" % (
                s.name, clients, ", ".join("%d" % d for d in done) + (" of %d" % clients if done else "–"),
                cell("%.0f", r.get(k + "p50_ms", [])), cell("%.0f", r.get(k + "p99_ms", [])),
                cell("%.0f", r.get(k + "max_ms", [])),
                ", ".join("%s: %d" % kv for kv in sorted(why.items())) or "none"))
    w("")
    w("Times are medians over the runs (range in brackets), of the completed clients only.")
    w("")
    if rec is not None:
        missing = [k for k in QUEUE_KEYS if k not in rec]
        if missing:
            w("The plugin did not record %s for edgelinkd." % " or ".join("`%s`" % k for k in missing))
    if rec is not None:
        w("edgelinkd's record of the forward: `%s`." % json.dumps(rec, sort_keys=True))
    w("")
    w("Subjects as run:")
    w("")
    for s in subjects:
        for c in s.commands:
            w("- %s: `%s`" % (s.name, c))
    w("")
    return lines

