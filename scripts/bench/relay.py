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

"edgelinkd kernel path" is edgelinkd's `"path": "kernel"` forwards (nftables
DNAT + masquerade, no relay process) in a second pod netns built like the
first (eth0 10.244.2.10 --veth-- client eth1 10.244.2.20; net1 from a
second plugin ADD on the same bridge): the same links and hops as direct.
It has a pod of its own because its table's forward chain drops whatever
it did not DNAT, which in the first pod would drop direct's routed packets.

The reverse direction (reverse.py): the device calls services in the
client netns (the cluster) through net1, edgelinkd's reverse forwards
(declared in the same ADD) against HAProxy bound to net1; one TCP stream
and short connections, a round of them within each round.

Subjects alternate within each round for each measure (A B C ..., the order
rotating by one every round), so that machine drift hits them all alike.

This file only runs the measures and writes the report; each subject of the
bench has its module beside it: lab.py (namespaces, topology, processes),
usage.py (/proc accounting), device.py (the device's services),
subjects.py (starting the peers), throughput.py, connections.py, udp.py,
footprint.py (idle memory, syscall profiles), fragile.py (bursts against
a device that accepts slowly), reverse.py (device -> pod -> cluster), report.py (the Markdown), verdict.py (what
fails the run).

    relay.py [--quick] [--rounds N] [--out FILE] [--only a,b,...]

EDGELINKD_ARGS (environment) is added to edgelinkd's command line, e.g.
"--workers 1". Needs root, iproute2, nftables, iperf3, socat, haproxy,
nginx with the stream module, and `make release` (edgelinkd, elk-loadgen, the static plugin).
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import device
import fragile
import lab
import reverse
import sustained
import verdict  # scripts/bench/verdict.py: which figures fail the run
from connections import conn_rate, rr
from device import HELPERS
from footprint import SOCAT_IDLE_MAX, idle_memory, syscall_profiles
from lab import CLOSE, DAEMON, DEV_IP, ECHO, IDLE, IPERF, KPOD_IP, LOADGEN, NGINX_STREAM, PLUGIN, POD_IP, UDP, Lab, Procs, raise_nofile
from report import report
from subjects import KERNEL, Subject, edgelink_forwards, kernel_forwards, start_haproxy, start_nginx, start_socat, wait_subject
from throughput import Iperf
from udp import UDP_LOADS, udp


def bring_up(the_lab, procs, only=None, with_reverse=True):
    """The lab, the device services and every subject, each checked end to
    end; the reverse direction's subjects too (with_reverse)."""
    tmp = the_lab.tmp
    want = lambda k: only is None or k in only
    the_lab.build()
    device_procs = device.start(procs)

    elk_ports, forwards = edgelink_forwards()
    # The fragile device's forward (fragile.py) rides on the same ADD; it is
    # shown with its own measure, not in the commands below.
    the_lab.attach(forwards + [fragile.forward()], reverse.entries() if with_reverse else [])
    if want("kernel"):
        k_ports, k_forwards = kernel_forwards()
        the_lab.attach_kernel(k_forwards)
    subjects = [Subject("direct", DEV_IP, {IPERF: IPERF, ECHO: ECHO, UDP: UDP, IDLE: IDLE, CLOSE: CLOSE},
                        commands=["client -> %s via the pod (routed, no relay)" % DEV_IP], peer=False)]
    if want("socat"):
        subjects.append(start_socat(procs))
    if want("haproxy"):
        subjects.append(start_haproxy(procs, tmp, "haproxy", 12000))
    if want("haproxy1m"):
        subjects.append(start_haproxy(procs, tmp, "haproxy-1m", 13000, pipesize=1 << 20))
    if want("nginx"):
        subjects.append(start_nginx(procs, tmp))
    subjects.append(Subject("edgelinkd", POD_IP, elk_ports, [the_lab.daemon],
                            ["edgelinkd run --state-dir DIR --log-level warn --probe-interval 0%s  (node netns; "
                             "defaults: 1 MiB pipes, sockets made on demand, a worker per CPU)"
                             % "".join(" " + a for a in os.environ.get("EDGELINKD_ARGS", "").split()),
                             "plugin ADD: mode bridge, forwards %s" % ", ".join(
                                 "%s/%d -> %s" % (f["protocol"], f["port"], f["target"]) for f in forwards)],
                            peer=False))
    if want("kernel"):
        subjects.append(Subject(KERNEL, KPOD_IP, k_ports, [], [
            "plugin ADD in the kernel path's pod (%s): mode bridge, forwards %s" % (KPOD_IP, ", ".join(
                "%s/%d -> %s" % (f["protocol"], f["port"], f["target"]) for f in k_forwards)) +
            ", each with \"path\": \"kernel\" (edgelinkd installs nftables DNAT + masquerade there)"],
            peer=False))
    for s in subjects:
        wait_subject(s, procs)
    return subjects, device_procs


def measure(r, title, fn, order, results, errors):
    """One measure of round r through each subject in `order`."""
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


# Rounds and seconds of the sustained short connections (sustained.py),
# by --quick.
SUSTAINED = {False: (4, 6), True: (3, 3)}


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
    ap.add_argument("--only", help="comma-separated subjects: direct,socat,haproxy,haproxy1m,nginx,edgelinkd,kernel")
    ap.add_argument("--measures", help="comma-separated measures (default all): "
                    "idle,tcp1,tcp8,conn,rr,udp,sustained,fragile,reverse,profile")
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("relay bench: run as root (network namespaces)")
    rounds = a.rounds or (1 if a.quick else 3)
    secs = {"iperf": 2, "short": 1, "udp": 1, "profile": 1} if a.quick else \
        {"iperf": 10, "short": 2, "udp": 2, "profile": 2}
    idle_n = 1000 if a.quick else 10000
    missing = [b for b in (PLUGIN, DAEMON, LOADGEN) if not os.access(b, os.X_OK)]
    missing += [b for b in ("socat", "haproxy", "nginx", "iperf3", "ip", "nft") if not shutil.which(b)]
    if not os.path.exists(NGINX_STREAM):
        missing.append(NGINX_STREAM + " (libnginx-mod-stream)")
    if missing:
        raise SystemExit("relay bench: missing %s (make bench builds and installs everything)" % ", ".join(missing))
    only = set(a.only.split(",")) if a.only else None
    picked = set(a.measures.split(",")) if a.measures else None

    def wanted(key):
        return picked is None or key in picked

    lab.FD_LIMIT = raise_nofile()
    # A relay holds two descriptors per connection.
    idle_n = min(idle_n, (lab.FD_LIMIT - 2000) // 2)
    started = time.time()
    tmp = tempfile.mkdtemp(prefix="edgelink-relay-bench-")
    procs = Procs(tmp)
    the_lab = Lab(tmp, procs)
    # SIGTERM (CI timeouts) unwinds through the finally below like Ctrl-C.
    signal.signal(signal.SIGTERM, interrupted)
    try:
        subjects, device_procs = bring_up(the_lab, procs, only, wanted("reverse"))
        rev_subjects, rev_measures = [], []
        if wanted("reverse"):
            rev_subjects, rev_measures = reverse.start(procs, tmp, the_lab.daemon, the_lab.net1,
                                                       only is None or "haproxy1m" in only, secs)
        print("relay bench: lab up in %.1f s; subjects: %s" % (
            time.time() - started, ", ".join(s.name for s in subjects + rev_subjects)), flush=True)

        iperf = Iperf(procs, secs, device_procs["iperf"])
        results = {s.name: {} for s in subjects + rev_subjects}
        errors = []
        measures = [
            ("tcp1", "TCP 1 stream", iperf.iperf1),
            ("tcp8", "TCP 8 streams", lambda s: {"gbps8": iperf.iperf(s, 8)["gbps"]}),
            ("conn", "short connections", lambda s: conn_rate(s, secs)),
            ("rr", "request/reply", lambda s: rr(s, secs)),
        ] + [("udp", "UDP %d client%s at %d/s" % (c, "" if c == 1 else "s", r),
              (lambda k, c, r: lambda s: udp(s, secs, k, c, r))(k, c, r)) for k, c, r in UDP_LOADS]
        # A load well within capacity, where edgelinkd's loss is checked
        # (verdict.py); the peers skip it.
        ck, cc, cr = verdict.UDP_CHECK_LOAD
        measures.append(("udp", "UDP check load, %d client at %d/s" % (cc, cr),
                         lambda s: {} if s.peer else udp(s, secs, ck, cc, cr)))
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
                measure(r, title, fn, order, results, errors)
            # The reverse direction, its subjects alternating the same way.
            if rev_subjects:
                k = r % len(rev_subjects)
                for title, fn in rev_measures:
                    measure(r, title, fn, rev_subjects[k:] + rev_subjects[:k], results, errors)
        sustained_subjects = []
        if wanted("sustained"):
            sustained_subjects = sustained.run(subjects, SUSTAINED[a.quick][0], SUSTAINED[a.quick][1], measure,
                                               results, errors)
        fragile_subjects, fragile_kinds, fragile_record = [], {}, None
        if wanted("fragile"):
            fragile_subjects, fragile_kinds = fragile.run(
                procs, tmp, the_lab.daemon, the_lab.forwards, only is None or "haproxy" in only,
                rounds, a.quick, results, errors)
            fragile_record = fragile.recorded(the_lab.state)  # before the state dir goes
        if not wanted("profile"):
            profile = None
        elif shutil.which("strace"):
            profile = syscall_profiles(subjects, results, secs)
        else:
            profile = None
            print("relay bench: strace is not installed: no syscall profile", flush=True)
    finally:
        procs.stop_all()
        the_lab.close()
        shutil.rmtree(tmp, ignore_errors=True)

    rev = reverse.section(rev_subjects, results, secs) if rev_subjects else []
    text, _ = report(a, subjects, results, profile, secs, rounds, idle_n, started, rev, rev_subjects)
    if sustained_subjects:
        text += "\n" + "\n".join(sustained.section(sustained_subjects, results, *SUSTAINED[a.quick]))
    if fragile_subjects:
        text += "\n" + "\n".join(fragile.section(fragile_subjects, results, fragile_kinds, a.quick, rounds,
                                                  fragile_record))
    if errors:
        text += "\nFailed measurements (not in the figures above):\n\n" + "".join("- %s\n" % e for e in errors)
    failed, notes = verdict.relay_checks(results, {s.name for s in subjects + fragile_subjects + rev_subjects
                                                   if s.peer})
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
