"""The relay half's Markdown: the tables per measure, the targets of
issues 4 and 12, how each figure was measured and the subjects' exact
commands."""
import os
import re
import statistics
import subprocess
import time

import lab
from cni import machine  # scripts/bench/cni.py: the same machine line in both halves
from lab import DAEMON, DEV_IP, KPOD_IP, POD_IP, UDP
from udp import UDP_LOADS

FRAGILE = re.compile(r"^fragile(\d+)_completed$")
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


def report(a, subjects, results, profile, secs, rounds, idle_n, started, reverse_lines=(), rev_subjects=()):
    """The relay half's Markdown; `reverse_lines` (reverse.section) follow
    the TCP table, `rev_subjects`' commands are listed with the others'."""
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
      "CPU or memory. **edgelinkd kernel path** is edgelinkd's `\"path\": \"kernel\"` forwards "
      "(nftables DNAT and masquerade, no relay process) in a second pod netns made the "
      "same way (eth0 %s, a veth to the client's second interface; net1 by a second plugin ADD on "
      "the same bridge): the same links and hops as direct, in a pod of its own because its table's "
      "forward chain drops whatever it did not DNAT, which would drop direct's routed packets in the "
      "first pod." % (POD_IP, DEV_IP, KPOD_IP))
    w("")
    w("### TCP")
    w("")
    table(w, subjects, results, TCP_COLUMNS)
    w("")
    lines.extend(reverse_lines)
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
         % (lab.FD_LIMIT, idle_n) if idle_n < 10000 and not a.quick else ""))
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
    w("### Targets (issue 12)")
    w("")
    w("Each a ratio of two subjects measured side by side in this run (medians over the rounds). "
      "HAProxy is the better of the two HAProxy variants in that column.")
    w("")
    w("| figure | target | measured | against | ratio | result |")
    w("|---|---|---|---|---|---|")
    for t in targets12(results):
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
      "net.ipv4.tcp_tw_reuse=1 in the client and pod netns for every subject (and in the device netns, the "
      "client of the reverse direction)." % secs["short"])
    w("- Latency: `elk-loadgen rr HOST:PORT --seconds %g` (one persistent connection, 64 bytes each way)."
      % secs["short"])
    w("- UDP: `elk-loadgen udp HOST:PORT --size 1400 --rate R --seconds %g [--concurrency 50]` "
      "(50 client sockets share the rate) against a Python UDP echo on the device (alone it keeps up "
      "with ~190k datagrams/s)." % secs["short"])
    w("")
    w("Subjects as run (in the pod netns unless said):")
    w("")
    for s in list(subjects) + list(rev_subjects):
        for c in s.commands:
            w("- %s: `%s`" % (s.name, c))
    w("")
    w("Versions: %s; %s; %s; %s; %s." % (version(["sh", "-c", "socat -V | sed -n 2p"]),
                                        version(["haproxy", "-v"]), version(["nginx", "-v"]),
                                        version(["iperf3", "--version"]), version([DAEMON, "--version"])))
    w("")
    w("Run time: %.0f s." % (time.time() - started))
    return "\n".join(lines) + "\n", tg


# An idle connection's user-space memory: issue 4 asked 4 KiB, issue 25 2.
IDLE_KIB = 2


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
        out.append(("idle connection, user space (KiB)", "≤ %g KiB" % IDLE_KIB, "–", "–", "–", "–", "not measured"))
    else:
        b, bn = best_peer(results, subjects, "pss_kib_conn", False)
        k = med(results[elk].get("kernel_kib_conn", []))
        kd = med(results["direct"].get("kernel_kib_conn", []))
        out.append(("idle connection, user space (KiB)", "≤ %g KiB (kernel beside it" % IDLE_KIB + ": %.1f KiB/conn, "
                    "%.1f beyond direct; %s pipes held)" % (k, k - kd, fmt("%d", med(results[elk].get("pipes", [])))),
                    "%.2f" % v, "%.2f (%s, Pss)" % (b, bn) if b is not None else "–", "–",
                    "%.2f× best" % (v / b) if b else "–",
                    "**met**" if v <= IDLE_KIB else "missed: %.2f KiB over" % (v - IDLE_KIB)))
    return out


def targets12(results):
    """The targets of issue 12 (the kernel path, the queueing relay), each a
    ratio of two subjects of the same run: rows (figure, target, measured,
    against, ratio, result). Pure: tested by test_report.py."""
    elk, kern = "edgelinkd", "edgelinkd kernel path"

    def get(name, key):
        return med(results.get(name, {}).get(key, []))

    def haproxy(key, higher):
        vals = [(med(r.get(key, [])), n) for n, r in sorted(results.items()) if n.startswith("HAProxy")]
        vals = [(v, n) for v, n in vals if v is not None]
        return (max if higher else min)(vals) if vals else (None, None)

    def row(label, name, key, f, ref, factor, higher=True):
        e = get(name, key)
        if ref == "direct":
            b, bn = get("direct", key), "direct"
        else:
            b, bn = haproxy(key, higher)
        target = "%s %.2f× %s" % ("≥" if higher else "≤", factor, "HAProxy" if ref != "direct" else "direct")
        if e is None or not b:
            return (label, target, fmt(f, e), "–", "–", "not measured")
        ratio = e / b
        ok = ratio >= factor if higher else ratio <= factor
        miss = "missed: %.0f%% %s" % (abs(ratio / factor - 1) * 100, "short" if higher else "over")
        return (label, target, "%s (%s)" % (fmt(f, e), name), "%s (%s)" % (fmt(f, b), bn), "%.2f×" % ratio,
                "**met**" if ok else miss)

    out = [
        row("kernel path TCP 1 stream (Gbit/s)", kern, "gbps1", "%.2f", "direct", 0.95),
        row("kernel path TCP 1 stream (Gbit/s)", kern, "gbps1", "%.2f", "haproxy", 1.3),
        row("kernel path connections/s", kern, "conn_s", "%.0f", "direct", 0.9),
        row("relay connections/s", elk, "conn_s", "%.0f", "haproxy", 1.1),
        row("relay request/reply p99 (µs)", elk, "p99_us", "%.0f", "haproxy", 1.0, higher=False),
        row("relay TCP 1 stream (Gbit/s)", elk, "gbps1", "%.2f", "haproxy", 1.0),
    ]
    r = results.get(elk, {})
    for n in sorted(int(FRAGILE.match(k).group(1)) for k in r if FRAGILE.match(k)):
        done = r["fragile%d_completed" % n]
        ok = bool(done) and min(done) >= n
        out.append(("fragile device, burst of %d clients (completed)" % n, "%d/%d every run" % (n, n),
                    ", ".join("%d/%d" % (d, n) for d in done), "–", "–",
                    "**met**" if ok else "missed: %d of %d in the worst run" % (min(done), n)))
    return out
