#!/usr/bin/env python3
"""Chaos: a SYN flood at a forward.

hping3 --flood -S from the client netns at the pod's address and the
forward's port for FLOOD seconds (bounded by `timeout`), from a spoofed
address (SPOOF, a new source port for every SYN). The pod routes SPOOF's
subnet to the client netns, which does not own it and does not forward:
the SYN-ACKs are dropped there unanswered, so every SYN leaves a half-open
connection in the pod until SYN cookies take over, as in a real flood.
(With random sources the pod has no route back and drops each SYN at
once: no flood at all.) Nothing leaves the lab. Meanwhile 50 established connections echo
every 0.5 s, and a probe opens a new connection (connect + one echo, 3 s
timeout) every 0.2 s, before, during and after the flood.

Checks: no established connection lost, new connections still get through
after the flood (and how many during it), the daemon's fds and RSS as
before; the pod's SYN cookie and listen-queue counters tell what the
kernel did.

    syn_flood.py      (CHAOS_FLOOD_SECONDS=20; QUICK=1: 8)
"""
import os
import socket
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "soak"))
import common  # noqa: E402
from common import Held, Sampler, Scenario, in_ns, lab, listening, seconds, wait_until  # noqa: E402

FLOOD = seconds("CHAOS_FLOOD_SECONDS", 20, 8)
PORT = 8080
SPOOF, SPOOF_NET = "10.99.0.1", "10.99.0.0/16"


def netstat(ns):
    """TcpExt counters of netns `ns`."""
    def read():
        with open("/proc/thread-self/net/netstat") as f:
            lines = f.read().splitlines()
        for a, b in zip(lines[::2], lines[1::2]):
            if a.startswith("TcpExt:"):
                return dict(zip(a.split()[1:], map(int, b.split()[1:])))
        return {}
    return in_ns(ns, read)


class Probe(common.Background):
    """A new connection + one echo every `every` s from the client netns:
    [(t, ok, seconds)]."""

    def __init__(self, clock, every=0.2):
        self.clock, self.every, self.out = clock, every, []
        super().__init__(lab.CLIENT)

    def run(self):
        while not self.stop_ev.wait(self.every):
            t, t0 = self.clock(), time.monotonic()
            try:
                ok = lab.tcp_echo_once(lab.POD_IP, PORT, 3.0)
            except OSError:
                ok = False
            self.out.append((t, ok, time.monotonic() - t0))


def main():
    with Scenario("synfl") as sc:
        sc.echo_device(lab.IDLE)
        d = sc.start_daemon()
        code, out, err = sc.add(lab.POD, "chaos-syn", [{"name": "api", "protocol": "tcp", "port": PORT,
                                                        "target": "%s:%d" % (lab.DEV_IP, lab.IDLE)}])
        assert code == 0, (out, err)
        wait_until(lambda: listening(lab.POD, PORT), 10)
        routes = common.sh("ip", "-n", lab.POD, "route", "show", "default").stdout.strip()
        if routes:
            raise SystemExit("syn_flood: the pod netns has a default route (%s): spoofed replies could leave" % routes)
        common.sh("ip", "-n", lab.POD, "route", "add", SPOOF_NET, "via", lab.CLIENT_IP)
        time.sleep(1.0)
        fds0 = common.fds_but_pipes(d.pid)
        n0 = netstat(lab.POD)
        with Sampler(lambda: d.pid) as smp, Held(smp.now, lab.POD_IP, PORT, n=50) as held, Probe(smp.now) as probe:
            time.sleep(5.0)
            t_flood = smp.now()
            fl = sc.procs.start("hping3", lab.CLIENT, ["timeout", "-s", "INT", "%g" % FLOOD, "hping3", "--flood", "-S",
                                                       "-a", SPOOF, "-p", str(PORT), lab.POD_IP])
            fl.wait(timeout=FLOOD + 30)
            t_flood_end = smp.now()
            time.sleep(10.0)
        n1 = netstat(lab.POD)
        wait_until(lambda: d.metrics().get("edgelink_active_connections", 0) == 0, 10)
        fds1 = common.fds_but_pipes(d.pid)
        tail = sc.procs.tail(fl, 600)
        sent = next((l.split()[0] for l in tail.splitlines() if "packets transmitted" in l), "?")
        phase = lambda a, b: [p for p in probe.out if a <= p[0] < b]  # noqa: E731
        before, during, after = phase(0, t_flood), phase(t_flood, t_flood_end), phase(t_flood_end, 1e9)
        rate = lambda ps: "%d/%d" % (sum(1 for p in ps if p[1]), len(ps))  # noqa: E731
        p50 = lambda ps: sorted(p[2] for p in ps if p[1])[len([p for p in ps if p[1]]) // 2] * 1000 if any(p[1] for p in ps) else None  # noqa: E731
        first_ok_after = next((p[0] - t_flood_end for p in after if p[1]), None)
        keys = ("SyncookiesSent", "SyncookiesRecv", "ListenOverflows", "ListenDrops", "TCPReqQFullDrop", "TCPReqQFullDoCookies")
        res = {"flood_s": FLOOD, "hping3_sent": sent, "held_lost": len(held.lost),
               "probe_before": rate(before), "probe_during": rate(during), "probe_after": rate(after),
               "probe_p50_ms_before": p50(before), "probe_p50_ms_during": p50(during), "probe_p50_ms_after": p50(after),
               "first_ok_after_flood_s": first_ok_after,
               "pod_tcpext": {k: n1.get(k, 0) - n0.get(k, 0) for k in keys}, "fds_before": fds0, "fds_after": fds1,
               "rss_before_kb": smp.at(t_flood)[1], "rss_after_kb": smp.samples[-1][1], "hping3_tail": tail[-300:]}
        common.save("syn_flood", res)

        def draw(ax):
            ax2 = ax.twinx()
            ax2.spines["right"].set_position(("axes", 1.12))
            ax2.scatter([p[0] for p in probe.out], [p[2] * 1000 for p in probe.out], s=4,
                        c=["tab:green" if p[1] else "tab:red" for p in probe.out])
            ax2.set_ylabel("new connection + echo (ms; red: failed)")
            ax2.set_yscale("log")
        fig = common.rss_figure("chaos-syn-flood", "SYN flood for %.0f s (shaded) at the forward" % FLOOD, smp,
                                spans=[(t_flood, t_flood_end, "flood")], extra=draw)
    common.table("Chaos: SYN flood (hping3 --flood, spoofed source) at a forward for %.0f s" % FLOOD, [
        ("SYNs sent by hping3", sent),
        ("established connections lost (50 held, echo every 0.5 s)", len(held.lost)),
        ("new connection + echo ok: before / during / after", "%s / %s / %s" % (res["probe_before"], res["probe_during"], res["probe_after"])),
        ("their median (ms): before / during / after", " / ".join("%.1f" % x if x is not None else "-" for x in
                                                                  (res["probe_p50_ms_before"], res["probe_p50_ms_during"], res["probe_p50_ms_after"]))),
        ("pod TcpExt: SyncookiesSent / ListenOverflows / ListenDrops",
         "%d / %d / %d" % tuple(res["pod_tcpext"][k] for k in ("SyncookiesSent", "ListenOverflows", "ListenDrops"))),
        ("edgelinkd RSS before / after (KiB); fds before / after", "%s / %s; %s / %s" % (res["rss_before_kb"], res["rss_after_kb"], common.fmt_fds(fds0), common.fmt_fds(fds1))),
        ("figure", fig)])
    bad = held.lost or not after or first_ok_after is None or common.fd_leak(fds0, fds1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
