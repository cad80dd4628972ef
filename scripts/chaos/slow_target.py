#!/usr/bin/env python3
"""Chaos: a target that accepts and never reads.

The device (this file's `_sink` mode) accepts every connection and never
reads from it. CONNS clients push as fast as their sockets take data for
PUSH seconds, then close. edgelinkd runs with --tcp-idle-timeout 15.

Checks: the bytes each client gets into the path stop growing (back-
pressure: socket buffers and one splice pipe, a few MiB, not the whole
stream); edgelinkd's RSS stays flat while it holds them; once the clients
have closed, nothing moves, and the idle timeout resets the stuck
connections: the daemon's connections go to 0 and its fds back to where
they were.

    slow_target.py    (CHAOS_SLOW_CONNS=20, CHAOS_SLOW_PUSH=30;
                       QUICK=1: 10 conns, 10 s)
"""
import os
import socket
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "soak"))
SINK = 7100
PORT = 8080
IDLE = 15


def sink(host, port):
    """Accept, never read; keep every socket open until killed."""
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((host, int(port)))
    ls.listen(1024)
    held = []
    while True:
        c, _ = ls.accept()
        held.append(c)


def push(host, n, secs, every=0.5):
    """n connections, each sent to without blocking for `secs`; returns
    (per-connection bytes taken, [(t, total bytes taken)])."""
    socks = []
    for _ in range(n):
        s = socket.create_connection((host, PORT), timeout=5)
        s.setblocking(False)
        socks.append(s)
    sent = [0] * n
    buf = b"x" * 65536
    timeline = []
    t0 = time.monotonic()
    nxt = t0
    while time.monotonic() - t0 < secs:
        moved = False
        for i, s in enumerate(socks):
            try:
                sent[i] += s.send(buf)
                moved = True
            except BlockingIOError:
                pass
            except OSError:
                pass
        if time.monotonic() >= nxt:
            timeline.append((time.monotonic() - t0, sum(sent)))
            nxt += every
        if not moved:
            time.sleep(0.05)
    for s in socks:
        s.close()
    return sent, timeline


def main():
    import common
    from common import Sampler, Scenario, in_ns, lab, listening, seconds, wait_for, wait_until

    conns = int(os.environ.get("CHAOS_SLOW_CONNS", "10" if common.QUICK else "20"))
    secs = seconds("CHAOS_SLOW_PUSH", 30, 10)
    with Scenario("slow") as sc:
        p = sc.procs.start("sink", lab.DEV, [sys.executable, os.path.abspath(__file__), "_sink", lab.DEV_IP, str(SINK)])
        wait_for("the sink", lambda: listening(lab.DEV, SINK), p, sc.procs)
        d = sc.start_daemon("--tcp-idle-timeout", str(IDLE))
        code, out, err = sc.add(lab.POD, "chaos-slow", [{"name": "sink", "protocol": "tcp", "port": PORT,
                                                         "target": "%s:%d" % (lab.DEV_IP, SINK)}])
        assert code == 0, (out, err)
        wait_until(lambda: listening(lab.POD, PORT), 10)
        time.sleep(1.0)
        fds0 = common.fds_but_pipes(d.pid)
        active = lambda: d.metrics().get("edgelink_active_connections", 0)  # noqa: E731
        with Sampler(lambda: d.pid) as smp:
            t_push = smp.now()
            sent, timeline = in_ns(lab.CLIENT, push, lab.POD_IP, conns, secs)
            t_closed = smp.now()
            held_after_close = active()
            m = d.metrics()
            freed = wait_until(lambda: active() == 0, IDLE + 30, 0.2)
            t_freed = smp.now()
            time.sleep(2.0)
        fds1 = common.fds_but_pipes(d.pid)
        # Backpressure: the share of the push after which nothing more was taken.
        total = timeline[-1][1] if timeline else 0
        stalled_at = next((t for t, b in timeline if b >= total), None)
        during = [s for s in smp.samples if t_push + 3 <= s[0] <= t_closed]
        res = {"conns": conns, "push_s": secs, "bytes_total": total, "per_conn_max": max(sent), "per_conn_min": min(sent),
               "stalled_after_s": stalled_at, "active_after_close": held_after_close,
               "bytes_to_target": m.get("edgelink_bytes_to_target_total", 0),
               "idle_timeouts": d.metrics().get("edgelink_idle_timeouts_total", 0),
               "freed_after_close_s": freed, "rss_min_kb": min(s[1] for s in during) if during else None,
               "rss_max_kb": max(s[1] for s in during) if during else None,
               "fds_before": fds0, "fds_peak": max(s[2] or 0 for s in smp.samples), "fds_after": fds1,
               "timeline": timeline}
        common.save("slow_target", res)

        def draw(ax):
            ax2 = ax.twinx()
            ax2.spines["right"].set_position(("axes", 1.12))
            ax2.plot([t_push + t for t, _ in timeline], [b / 2 ** 20 for _, b in timeline], color="tab:green")
            ax2.set_ylabel("MiB taken from the clients", color="tab:green")
        fig = common.rss_figure("chaos-slow-target", "%d clients push to a target that never reads; idle timeout %d s"
                                % (conns, IDLE), smp, marks=[(t_closed, "clients close"), (t_freed, "freed")], extra=draw)
    mib = 2 ** 20
    common.table("Chaos: a target that accepts and never reads (%d clients, %.0f s)" % (conns, secs), [
        ("taken from each client: min / max (MiB)", "%.2f / %.2f" % (res["per_conn_min"] / mib, res["per_conn_max"] / mib)),
        ("nothing more taken after (s)", "%.1f" % stalled_at if stalled_at is not None else "-"),
        ("edgelinkd RSS while holding them: min / max (KiB)", "%s / %s" % (res["rss_min_kb"], res["rss_max_kb"])),
        ("connections held after the clients closed", int(held_after_close)),
        ("reset by the idle timeout after (s) / counted", "%s / %d" % ("%.1f" % freed if freed is not None else "never", res["idle_timeouts"])),
        ("fds before / peak / after", "%s / %s / %s" % (common.fmt_fds(fds0), res["fds_peak"], common.fmt_fds(fds1))),
        ("figure", fig)])
    bad = freed is None or common.fd_leak(fds0, fds1) or stalled_at is None or stalled_at > secs - 2
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_sink":
        sink(*sys.argv[2:])
    else:
        sys.exit(main())
