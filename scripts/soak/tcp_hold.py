#!/usr/bin/env python3
"""Soak: CONNS concurrent TCP connections held open through one forward for
SECONDS, each echoing 16 bytes every PERIOD seconds.

The client (this file's `_client` mode, one epoll loop in the client netns)
opens the connections, then sends on each in turn so that CONNS/PERIOD
echoes go out per second, and counts echoes answered, echoes late by more
than 5 s, and connections lost. The device answers with scripts/bench's
epoll echo. edgelinkd's RSS and fds are sampled every second.

Checks: RSS flat after the warm-up (all connections up + a sixth of the
hold, at least 60 s), no echo lost, no connection lost, fds and the state
directory back to where they were once the client has gone.

    tcp_hold.py       (SOAK_TCP_SECONDS=600, SOAK_TCP_CONNS=10000,
                       SOAK_TCP_PERIOD=10; QUICK=1: 15 s, 1000)
"""
import json
import os
import resource
import selectors
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SECS_DEFAULT, SECS_QUICK = 600, 15


def client(host, port, n, period, secs, out):
    """The client's event loop; writes {summary, timeline} to `out`."""
    n, period, secs, port = int(n), float(period), float(secs), int(port)
    resource.setrlimit(resource.RLIMIT_NOFILE, (n + 1024, n + 1024))
    sel = selectors.EpollSelector()
    t0 = time.monotonic()
    conns, failed_connect, pending, i = [], 0, {}, 0
    while (i < n or pending) and time.monotonic() - t0 < secs:
        while i < n and len(pending) < 256:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            s.connect_ex((host, port))
            pending[s] = time.monotonic()
            sel.register(s, selectors.EVENT_WRITE)
            i += 1
        for key, _ in sel.select(0.5):
            s = key.fileobj
            sel.unregister(s)
            del pending[s]
            if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                failed_connect += 1
                s.close()
            else:
                conns.append(s)
        for s, t in list(pending.items()):
            if time.monotonic() - t > 10:
                sel.unregister(s)
                del pending[s]
                s.close()
                failed_connect += 1
    connected_s = time.monotonic() - t0
    print(json.dumps({"connected": len(conns), "after_s": connected_s}), file=sys.stderr, flush=True)
    # Hold: connection j sends when the tick is j modulo the ticks per period.
    tick = 0.1
    per = max(1, int(round(period / tick)))
    state = {}  # socket -> [index, sent at or None, bytes awaited]
    for j, s in enumerate(conns):
        state[s] = [j, None, 0]
        sel.register(s, selectors.EVENT_READ)
    ok = late = lost = 0
    lat, lost_at = [], []
    timeline = {}  # second -> [ok, late, lost]
    k = 0
    next_tick = time.monotonic()
    hold_end = t0 + secs
    while time.monotonic() < hold_end and state:
        now = time.monotonic()
        if now >= next_tick:
            for s, st in list(state.items()):
                if st[0] % per == k % per and st[1] is None:
                    try:
                        s.send(b"e" * 16)
                        st[1], st[2] = now, 16
                    except OSError:
                        pass
                elif st[1] is not None and now - st[1] > 5:
                    late += 1
                    timeline.setdefault(int(now - t0), [0, 0, 0])[1] += 1
                    st[1] = None
            k += 1
            next_tick += tick
        for key, _ in sel.select(max(0.0, next_tick - time.monotonic())):
            s = key.fileobj
            st = state.get(s)
            try:
                b = s.recv(4096)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                b = b""
            sec = int(time.monotonic() - t0)
            if not b:
                lost += 1
                lost_at.append((round(time.monotonic() - t0, 2), st[0], st[1] is not None))
                timeline.setdefault(sec, [0, 0, 0])[2] += 1
                sel.unregister(s)
                s.close()
                del state[s]
                continue
            st[2] -= len(b)
            if st[2] <= 0 and st[1] is not None:
                ok += 1
                lat.append(time.monotonic() - st[1])
                timeline.setdefault(sec, [0, 0, 0])[0] += 1
                st[1] = None
    for s in list(state):
        s.close()
    lat.sort()
    res = {"connected": len(conns), "failed_connect": failed_connect, "connected_after_s": connected_s,
           "echoes_ok": ok, "echoes_late": late, "lost": lost, "still_open": len(state),
           "echo_p50_ms": lat[len(lat) // 2] * 1000 if lat else None,
           "echo_p99_ms": lat[int(len(lat) * 0.99)] * 1000 if lat else None,
           "lost_at": lost_at[:200], "timeline": sorted(timeline.items())}
    with open(out, "w") as f:
        json.dump(res, f)


def main():
    import common
    from common import Sampler, Scenario, lab, listening, seconds, state_listing, wait_for, wait_until

    secs = seconds("SOAK_TCP_SECONDS", SECS_DEFAULT, SECS_QUICK)
    n = int(os.environ.get("SOAK_TCP_CONNS", "1000" if common.QUICK else "10000"))
    period = float(os.environ.get("SOAK_TCP_PERIOD", "10"))
    port = 8080
    with Scenario("tcp") as sc:
        sc.echo_device(lab.IDLE)
        d = sc.start_daemon()
        code, out, err = sc.add(lab.POD, "soak-tcp", [{"name": "hold", "protocol": "tcp", "port": port,
                                                       "target": "%s:%d" % (lab.DEV_IP, lab.IDLE)}])
        if code != 0:
            raise SystemExit("tcp_hold: ADD failed: %s %s" % (out, err))
        wait_for("the forward", lambda: listening(lab.POD, port), d.p, sc.procs)
        time.sleep(1.0)
        fds0, state0 = common.fds_but_pipes(d.pid), state_listing(sc.lab.state)
        res_path = os.path.join(sc.tmp, "client.json")
        with Sampler(lambda: d.pid) as smp:
            t_start = smp.now()
            cl = sc.procs.start("client", lab.CLIENT, [sys.executable, os.path.abspath(__file__), "_client",
                                                        lab.POD_IP, str(port), str(n), str(period), str(secs),
                                                        res_path])
            up = wait_until(lambda: d.metrics().get("edgelink_active_connections", 0) >= n, 120, 0.5)
            peak_active = 0
            m_hold = {}
            while cl.poll() is None and smp.now() < t_start + secs + 120:
                m = d.metrics()
                if smp.now() < t_start + secs - 5:
                    m_hold = m  # the last reading while every connection is held
                peak_active = max(peak_active, m.get("edgelink_active_connections", 0))
                time.sleep(2.0)
            t_hold_end = smp.now()
            drained = wait_until(lambda: d.metrics().get("edgelink_active_connections", 0) == 0, 60, 0.5)
            time.sleep(2.0)
            fds1, state1 = common.fds_but_pipes(d.pid), state_listing(sc.lab.state)
        common.keep_log(d.p, "tcp_hold-edgelinkd")
        if not os.path.exists(res_path):
            raise SystemExit("tcp_hold: the client wrote no result:\n" + sc.procs.tail(cl))
        with open(res_path) as f:
            r = json.load(f)
        t_up = t_start + r["connected_after_s"]
        warm = t_up + max(5.0 if common.QUICK else 60.0, (secs - r["connected_after_s"]) / 6)
        held = [(t, rss) for t, rss, _ in smp.samples if warm <= t <= t_hold_end - 3]
        res = {"conns": n, "seconds": secs, "period": period, "client": {k: v for k, v in r.items() if k != "timeline"},
               "all_up_after_s": up, "peak_active": peak_active,
               "rss_warm_kb": smp.at(warm)[1], "rss_end_kb": smp.at(t_hold_end - 3)[1],
               "rss_idle_after_kb": smp.samples[-1][1],
               "slope_kb_min": common.slope_kb_per_min(held),
               "slope_second_half_kb_min": common.second_half_slope(held), "fds_before": fds0, "fds_after": fds1,
               "fds_peak": max(s[2] or 0 for s in smp.samples), "drained_after_s": drained,
               "state_same": state0 == state1, "warm_at_s": warm, "lost_at": r.get("lost_at"),
               "metrics_while_held": {k: v for k, v in m_hold.items() if k.startswith("edgelink_") and (
                   "connect" in k or "error" in k or "timeout" in k or "rejected" in k or "queue" in k)},
               "timeline": r.get("timeline")}
        common.save("tcp_hold", res)
        fig = common.rss_figure("soak-tcp-hold", "%d TCP connections held, an echo on each every %.0f s"
                                % (n, period), smp, marks=[(t_up, "all up"), (warm, "warm"), (t_hold_end, "closed")])
    c = res["client"]
    common.table("Soak: %d concurrent TCP connections for %.0f s" % (n, secs), [
        ("connected / failed connects", "%d / %d" % (c["connected"], c["failed_connect"])),
        ("active in edgelinkd at peak", int(peak_active)),
        ("echoes answered / late (>5 s) / connections lost", "%d / %d / %d" % (c["echoes_ok"], c["echoes_late"], c["lost"])),
        ("echo p50 / p99 (ms)", "%.2f / %.2f" % (c["echo_p50_ms"] or 0, c["echo_p99_ms"] or 0)),
        ("RSS at warm-up end / at the end (KiB)", "%d / %d" % (res["rss_warm_kb"], res["rss_end_kb"])),
        ("RSS slope after warm-up / over its second half (KiB/min)",
         "%.1f / %.1f" % (res["slope_kb_min"], res["slope_second_half_kb_min"])),
        ("RSS once the clients left (KiB)", res["rss_idle_after_kb"]),
        ("fds before / peak / after", "%s / %s / %s" % (common.fmt_fds(fds0), res["fds_peak"], common.fmt_fds(fds1))),
        ("state dir unchanged", res["state_same"]),
        ("figure", fig)])
    bad = (c["connected"] < n or c["echoes_late"] or c["lost"] or common.fd_leak(fds0, fds1) or not res["state_same"])
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_client":
        client(*sys.argv[2:])
    else:
        sys.exit(main())
