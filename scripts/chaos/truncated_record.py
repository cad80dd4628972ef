#!/usr/bin/env python3
"""Chaos: one attachment record truncated on disk while edgelinkd serves it
and another pod.

Pod A (the lab's pod) and pod B (the lab's second pod) each have a TCP
forward; clients use both (elk-loadgen slices on B, 10 held connections on
each). A's record is cut to half its length in place. Then the runtime's
DEL for A runs, with A's config as a runtime sends it.

Checks: /status lists A's record as malformed; B's clients see no failure;
the DEL exits 0 and removes A's record, its reservation and its link; the
malformed report clears; edgelinkd's fds and the state directory are then
what they were with B alone.

The record is cut with truncate(2), which the daemon's inotify watch
(close-write, create, move, delete) does not see: the periodic pass finds
it.

    truncated_record.py   (CHAOS_RECONCILE=30 edgelinkd's --reconcile-interval;
                           QUICK=1: 5)
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "soak"))
import common  # noqa: E402
from common import ConnLoad, Held, Sampler, Scenario, cni, lab, links, listening, state_listing, wait_until  # noqa: E402

PORT = 8080
RECONCILE = common.seconds("CHAOS_RECONCILE", 30, 5)


def main():
    with Scenario("trunc") as sc:
        sc.echo_device(lab.IDLE)
        d = sc.start_daemon("--reconcile-interval", "%g" % RECONCILE)
        fwd = [{"name": "api", "protocol": "tcp", "port": PORT, "target": "%s:%d" % (lab.DEV_IP, lab.IDLE)}]
        code, out, err = sc.add(lab.KPOD, "pod-b", fwd)
        assert code == 0, (out, err)
        wait_until(lambda: listening(lab.KPOD, PORT), 10)
        time.sleep(1.0)
        fds_b, state_b, node_b = common.fds_but_pipes(d.pid), state_listing(sc.lab.state), links(lab.NODE)
        code, out, err = sc.add(lab.POD, "pod-a", fwd)
        assert code == 0, (out, err)
        conf_a = {"cniVersion": "1.0.0", "name": "soak", "type": "edgelink", "mode": "bridge", "bridge": "edge0",
                  "uplink": "uplink0", "stateDir": sc.lab.state,
                  "ipam": {"ranges": [[{"subnet": "172.17.16.0/24", "rangeStart": "172.17.16.200",
                                        "rangeEnd": "172.17.16.250"}]], "nodeName": "soak"}, "forwards": fwd}
        wait_until(lambda: listening(lab.POD, PORT), 10)
        rec_dir = os.path.join(sc.lab.state, "attachments")
        rec_a = [f for f in os.listdir(rec_dir) if f.startswith("pod-a")]
        assert len(rec_a) == 1, os.listdir(rec_dir)
        rec_a = os.path.join(rec_dir, rec_a[0])
        ev = {}
        with Sampler(lambda: d.pid) as smp, \
                ConnLoad(smp.now, "%s:%d" % (lab.KPOD_IP, PORT)) as load, \
                Held(smp.now, lab.KPOD_IP, PORT, n=10) as held_b, \
                Held(smp.now, lab.POD_IP, PORT, n=10) as held_a:
            time.sleep(5.0)
            ev["truncated"] = smp.now()
            os.truncate(rec_a, os.path.getsize(rec_a) // 2)
            reported = wait_until(lambda: len(d.status().get("malformedRecords", [])) == 1, RECONCILE + 10, 0.1)
            st = d.status()
            malformed = st.get("malformedRecords", [])
            a_served = any(a.get("podName") == "pod-a" or "pod-a" in str(a.get("containerId", ""))
                           for a in st.get("attachments", []))
            a_listening = listening(lab.POD, PORT)
            time.sleep(5.0)
            a_listening_later = listening(lab.POD, PORT)
            ev["del"] = smp.now()
            dcode, dout, derr = cni("DEL", conf_a, "pod-a", lab.POD)
            cleared = wait_until(lambda: not d.status().get("malformedRecords"), 30, 0.1)
            clean = wait_until(lambda: state_listing(sc.lab.state) == state_b and links(lab.NODE) == node_b
                               and "net1" not in links(lab.POD), 30, 0.1)
            time.sleep(5.0)
        fds1 = common.fds_but_pipes(d.pid)
        ok_b, failed_b = load.totals()
        # A's DEL ends A's connections, as it should: only losses before it count.
        lost_a = [t for t in held_a.lost if t < ev["del"]]
        res = {"reported_after_s": reported, "malformed": malformed, "a_still_served": a_served,
               "a_listening_after_report": a_listening, "a_listening_5s_later": a_listening_later,
               "a_held_lost_before_del": len(lost_a), "a_held_lost": len(held_a.lost), "b_held_lost": len(held_b.lost),
               "b_load_ok": ok_b, "b_load_failed": failed_b,
               "del_exit": dcode, "del_out": dout if dcode else "", "del_err": derr[-300:] if dcode else "",
               "report_cleared_after_s": cleared, "clean_after_s": clean,
               "state_leaked": sorted(set(state_listing(sc.lab.state)) - set(state_b)),
               "net1_left_in_pod": "net1" in links(lab.POD), "fds_b_only": fds_b, "fds_after": fds1}
        common.save("truncated_record", res)

        def draw(ax):
            ax2 = ax.twinx()
            ax2.spines["right"].set_position(("axes", 1.12))
            ax2.bar([x[0] for x in load.timeline], [x[2] for x in load.timeline],
                    width=[x[1] - x[0] for x in load.timeline], align="edge", color="tab:green", alpha=0.4)
            ax2.set_ylabel("pod B: connections ok per slice", color="tab:green")
            for t in held_a.lost:
                ax.axvline(t, color="tab:red", lw=0.5)
        fig = common.rss_figure("chaos-truncated-record", "pod A's record truncated, then A's DEL; red: A's held connections lost",
                                smp, marks=[(ev["truncated"], "truncated"), (ev["del"], "DEL")], extra=draw)
    common.table("Chaos: an attachment record truncated on disk", [
        ("reported in /status malformedRecords after (s)", "%.1f" % reported if reported is not None else "never"),
        ("pod A still served / listening after the report / 5 s later", "%s / %s / %s" % (a_served, a_listening, a_listening_later)),
        ("pod A held connections lost before its DEL (10 held)", len(lost_a)),
        ("pod B: short connections ok / failed; held lost", "%d / %d; %d" % (ok_b, failed_b, len(held_b.lost))),
        ("A's DEL exit code", dcode),
        ("report cleared / all of A gone after the DEL (s)", "%s / %s" % (cleared, clean)),
        ("state entries leaked; net1 left in A", "%d; %s" % (len(res["state_leaked"]), res["net1_left_in_pod"])),
        ("fds with B only / after", "%s / %s" % (common.fmt_fds(fds_b), common.fmt_fds(fds1))),
        ("figure", fig)])
    bad = (reported is None or failed_b or held_b.lost or not a_listening_later or lost_a or dcode != 0
           or clean is None or common.fd_leak(fds_b, fds1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
