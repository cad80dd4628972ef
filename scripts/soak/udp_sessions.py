#!/usr/bin/env python3
"""Soak: rounds of SESSIONS distinct UDP client sessions through one forward
for SECONDS, against a session table bounded at MAX (--udp-max-sessions),
so that most sessions are evicted.

The client (this file's `_client` mode, in the client netns) has four
addresses and SESSIONS/4 ports on each: every (address, port) sends one
datagram and waits for its echo, 500 sockets at a time, so each round makes
SESSIONS new sessions. Evictions and sessions come from /metrics.

Checks: every echo back, evictions = sessions beyond the bound, the table
at its bound and not beyond, RSS flat after the first round, and once the
sessions idle out (--udp-idle-timeout 20) the daemon's fds back to where
they started.

    udp_sessions.py   (SOAK_UDP_SECONDS=600, SOAK_UDP_SESSIONS=50000,
                       SOAK_UDP_MAX=10000; QUICK=1: 15 s, 20000, 5000)
"""
import json
import os
import selectors
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

ADDRS = ["10.244.1.%d" % i for i in (21, 22, 23, 24)]
IDLE = 20


def client(host, port, sessions, secs, out):
    port, sessions, secs = int(port), int(sessions), float(secs)
    per = (sessions + len(ADDRS) - 1) // len(ADDRS)
    tuples = [(a, 20000 + i) for i in range(per) for a in ADDRS][:sessions]
    t0 = time.monotonic()
    rounds = []
    while time.monotonic() - t0 < secs:
        r0 = time.monotonic()
        sent = got = errors = 0
        for b in range(0, len(tuples), 500):
            sel = selectors.EpollSelector()
            socks = []
            for addr in tuples[b:b + 500]:
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(addr)
                    s.sendto(b"s" * 32, (host, port))
                    sent += 1
                except OSError:
                    errors += 1
                    s.close()
                    continue
                s.setblocking(False)
                sel.register(s, selectors.EVENT_READ)
                socks.append(s)
            waiting, deadline = len(socks), time.monotonic() + 1.0
            while waiting and time.monotonic() < deadline:
                for key, _ in sel.select(0.2):
                    try:
                        key.fileobj.recv(2048)
                        got += 1
                    except OSError:
                        errors += 1
                    sel.unregister(key.fileobj)
                    waiting -= 1
            for s in socks:
                s.close()
            sel.close()
        rounds.append({"t0": r0 - t0, "t1": time.monotonic() - t0, "sent": sent, "got": got, "errors": errors})
        print(json.dumps(rounds[-1]), file=sys.stderr, flush=True)
    with open(out, "w") as f:
        json.dump(rounds, f)


def main():
    import common
    from common import Sampler, Scenario, lab, listening, seconds, sh, state_listing, wait_for, wait_until

    secs = seconds("SOAK_UDP_SECONDS", 600, 15)
    sessions = int(os.environ.get("SOAK_UDP_SESSIONS", "20000" if common.QUICK else "50000"))
    bound = int(os.environ.get("SOAK_UDP_MAX", "5000" if common.QUICK else "10000"))
    port = 5000
    with Scenario("udp") as sc:
        for a in ADDRS:
            sh("ip", "-n", lab.CLIENT, "addr", "add", a + "/24", "dev", "eth0")
        sc.echo_device(lab.UDP, "_udp-echo")
        d = sc.start_daemon("--udp-max-sessions", str(bound), "--udp-idle-timeout", str(IDLE))
        code, out, err = sc.add(lab.POD, "soak-udp", [{"name": "telemetry", "protocol": "udp", "port": port,
                                                       "target": "%s:%d" % (lab.DEV_IP, lab.UDP)}])
        if code != 0:
            raise SystemExit("udp_sessions: ADD failed: %s %s" % (out, err))
        wait_for("the forward", lambda: listening(lab.POD, port, "udp"), d.p, sc.procs)
        time.sleep(1.0)
        fds0, state0, m0 = common.fds_but_pipes(d.pid), state_listing(sc.lab.state), d.metrics()
        res_path = os.path.join(sc.tmp, "client.json")
        peak = 0
        with Sampler(lambda: d.pid) as smp:
            t_start = smp.now()
            cl = sc.procs.start("client", lab.CLIENT, [sys.executable, os.path.abspath(__file__), "_client",
                                                        lab.POD_IP, str(port), str(sessions), str(secs), res_path])
            while cl.poll() is None and smp.now() < t_start + secs + 300:
                peak = max(peak, d.metrics().get("edgelink_active_udp_sessions", 0))
                time.sleep(1.0)
            t_end = smp.now()
            m1 = d.metrics()
            idled = wait_until(lambda: d.metrics().get("edgelink_active_udp_sessions", 0) == 0, IDLE + 60, 0.5)
            time.sleep(2.0)
            fds1, state1 = common.fds_but_pipes(d.pid), state_listing(sc.lab.state)
        if not os.path.exists(res_path):
            raise SystemExit("udp_sessions: the client wrote no result:\n" + sc.procs.tail(cl))
        with open(res_path) as f:
            rounds = json.load(f)
        delta = lambda k: m1.get(k, 0) - m0.get(k, 0)  # noqa: E731
        ends = [(t_start + r["t1"], smp.at(t_start + r["t1"])[1]) for r in rounds]
        res = {"sessions_per_round": sessions, "bound": bound, "seconds": secs, "rounds": len(rounds),
               "sent": sum(r["sent"] for r in rounds), "echoed": sum(r["got"] for r in rounds),
               "client_errors": sum(r["errors"] for r in rounds),
               "sessions_total": delta("edgelink_udp_sessions_total"),
               "evictions": delta("edgelink_udp_evictions_total"),
               "drops": delta("edgelink_udp_drops_total"), "peak_active": peak,
               "rss_warm_kb": ends[0][1] if ends else None, "rss_end_kb": ends[-1][1] if ends else None,
               "slope_kb_min": common.slope_kb_per_min(ends[1:]),
               "slope_second_half_kb_min": common.second_half_slope(ends[1:]),
               "rss_idle_after_kb": smp.samples[-1][1], "fds_before": fds0, "fds_after": fds1,
               "fds_peak": max(s[2] or 0 for s in smp.samples), "idled_out_after_s": idled,
               "state_same": state0 == state1, "round_list": rounds}
        common.save("udp_sessions", res)
        fig = common.rss_figure("soak-udp-sessions", "rounds of %d UDP sessions, table bound %d"
                                % (sessions, bound), smp, marks=[(e[0], "round") for e in ends])
    common.table("Soak: %d UDP sessions per round against a table of %d for %.0f s" % (sessions, bound, secs), [
        ("rounds / datagrams sent / echoed", "%d / %d / %d" % (res["rounds"], res["sent"], res["echoed"])),
        ("sessions created / evicted (/metrics)", "%d / %d" % (res["sessions_total"], res["evictions"])),
        ("sessions open at peak (bound %d)" % bound, int(peak)),
        ("RSS after round 1 / at the end (KiB)", "%s / %s" % (res["rss_warm_kb"], res["rss_end_kb"])),
        ("RSS slope after warm-up / over its second half (KiB/min)",
         "%.1f / %.1f" % (res["slope_kb_min"], res["slope_second_half_kb_min"])),
        ("fds before / peak / after the idle timeout", "%s / %s / %s" % (common.fmt_fds(fds0), res["fds_peak"], common.fmt_fds(fds1))),
        ("state dir unchanged", res["state_same"]),
        ("figure", fig)])
    # A datagram may be lost on a loaded machine (socket buffers, the 1 s
    # wait): up to 1 in 10,000 passes.
    bad = (res["echoed"] < res["sent"] * 0.9999 or peak > bound or common.fd_leak(fds0, fds1) or not res["state_same"]
           or res["evictions"] < res["sessions_total"] - bound - 1)
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_client":
        client(*sys.argv[2:])
    else:
        sys.exit(main())
