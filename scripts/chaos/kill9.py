#!/usr/bin/env python3
"""Chaos: edgelinkd killed with SIGKILL every EVERY seconds for SECONDS while
clients use a forward, and started again at once as a supervisor would.

Load: elk-loadgen conn-rate (4 clients, 1 s slices) and 20 held connections
echoing every 0.5 s, both from the client netns. For each kill: the time
until the forward listens again in the pod netns, and until a client's
echo through it works; the held connections lost; the failed connects.

Checks: every restart serves again, the state directory is what it was,
and the last daemon's fds are what the first had at the same point.

    kill9.py          (CHAOS_KILL_SECONDS=300, CHAOS_KILL_EVERY=10;
                       QUICK=1: 20 s, every 5 s)
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "soak"))
import common  # noqa: E402
from common import ConnLoad, Held, Sampler, Scenario, lab, listening, seconds, state_listing, wait_until  # noqa: E402

SECS = seconds("CHAOS_KILL_SECONDS", 300, 20)
EVERY = seconds("CHAOS_KILL_EVERY", 10, 5)
PORT = 8080


def echo_works():
    return common.lab.works(lab.CLIENT, lab.tcp_echo_once, lab.POD_IP, PORT, 0.5)


def main():
    with Scenario("kill9") as sc:
        sc.echo_device(lab.IDLE)
        d = sc.start_daemon()
        code, out, err = sc.add(lab.POD, "chaos-kill", [{"name": "api", "protocol": "tcp", "port": PORT,
                                                         "target": "%s:%d" % (lab.DEV_IP, lab.IDLE)}])
        if code != 0:
            raise SystemExit("kill9: ADD failed: %s %s" % (out, err))
        wait_until(lambda: listening(lab.POD, PORT), 10)
        time.sleep(1.0)
        fds0, state0 = common.fds_but_pipes(d.pid), state_listing(sc.lab.state)
        kills = []
        with Sampler(lambda: d.pid) as smp, \
                ConnLoad(smp.now, "%s:%d" % (lab.POD_IP, PORT)) as load, \
                Held(smp.now, lab.POD_IP, PORT) as held:
            t_end = smp.now() + SECS
            next_kill = smp.now() + EVERY
            while next_kill < t_end:
                time.sleep(max(0.0, next_kill - smp.now()))
                t_kill = smp.now()
                d.kill9()
                t0 = time.monotonic()
                d.start()
                started = time.monotonic() - t0
                listen = wait_until(lambda: listening(lab.POD, PORT), 30, 0.01)
                echo = wait_until(echo_works, 30, 0.01)
                kills.append({"t": t_kill, "started_s": started, "listening_s": (started + listen) if listen is not None else None,
                              "echo_s": (started + (listen or 0) + echo) if echo is not None else None})
                print("kill at %.1f s: socket after %.3f s, listening after %s s, echo after %s s"
                      % (t_kill, started, kills[-1]["listening_s"], kills[-1]["echo_s"]), flush=True)
                next_kill += EVERY
            time.sleep(min(EVERY, 5.0))
        time.sleep(2.0)
        fds1, state1 = common.fds_but_pipes(d.pid), state_listing(sc.lab.state)
        ok, failed = load.totals()
        lost = held.lost
        per_kill_lost = [sum(1 for t in lost if k["t"] <= t < k["t"] + EVERY) for k in kills]
        listens = [k["listening_s"] for k in kills if k["listening_s"] is not None]
        echoes = [k["echo_s"] for k in kills if k["echo_s"] is not None]
        res = {"seconds": SECS, "every": EVERY, "kills": len(kills), "kill_list": kills,
               "recovered": len(echoes), "listen_max_s": max(listens) if listens else None,
               "listen_median_s": sorted(listens)[len(listens) // 2] if listens else None,
               "echo_max_s": max(echoes) if echoes else None,
               "echo_median_s": sorted(echoes)[len(echoes) // 2] if echoes else None,
               "load_ok": ok, "load_failed": failed, "held_lost": len(lost),
               "held_lost_per_kill": per_kill_lost, "held_reconnects_failed": held.reconnects_failed,
               "fds_first": fds0, "fds_last": fds1, "state_same": state0 == state1,
               "load_timeline": load.timeline}
        common.save("kill9", res)

        def draw(ax):
            ax2 = ax.twinx()
            ax2.spines["right"].set_position(("axes", 1.12))
            ax2.bar([x[0] for x in load.timeline], [max(0, x[3]) for x in load.timeline],
                    width=[x[1] - x[0] for x in load.timeline], align="edge", color="tab:red", alpha=0.5)
            ax2.set_ylabel("failed connects per slice", color="tab:red")
            for k in kills:
                if k["echo_s"] is not None:
                    ax.axvspan(k["t"], k["t"] + k["echo_s"], color="tab:red", alpha=0.15)
        fig = common.rss_figure("chaos-kill9", "kill -9 every %.0f s: %d kills; shaded: until an echo works again"
                                % (EVERY, len(kills)), smp, marks=[(k["t"], "kill") for k in kills], extra=draw)
    common.table("Chaos: kill -9 of edgelinkd every %.0f s for %.0f s" % (EVERY, SECS), [
        ("kills / recovered", "%d / %d" % (len(kills), len(echoes))),
        ("until the forward listens: median / max (s)", "%.3f / %.3f" % (res["listen_median_s"] or 0, res["listen_max_s"] or 0)),
        ("until an echo works: median / max (s)", "%.3f / %.3f" % (res["echo_median_s"] or 0, res["echo_max_s"] or 0)),
        ("short connections ok / failed", "%d / %d" % (ok, failed)),
        ("held connections lost (20 held)", "%d (per kill: %s)" % (len(lost), sorted(set(per_kill_lost)))),
        ("fds of the first / the last daemon", "%s / %s" % (common.fmt_fds(fds0), common.fmt_fds(fds1))),
        ("state dir unchanged", res["state_same"]),
        ("figure", fig)])
    bad = len(echoes) < len(kills) or common.fd_leak(fds0, fds1) or not res["state_same"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
