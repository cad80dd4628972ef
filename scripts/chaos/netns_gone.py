#!/usr/bin/env python3
"""Chaos: the pod's netns deleted (`ip netns del`, as a runtime does after a
pod dies without a DEL reaching edgelink) while clients use its forwards.

The name goes at once; the namespace itself lives on as long as something
holds it: edgelinkd's listeners and relayed sockets do. Measured from the
deletion: when edgelinkd reclaims the attachment (/metrics), when its record
and reservation are gone, when the namespace is really freed (the pod's
veth peers vanish from the client and the node netns), and what the clients
saw.

Checks: reclaimed within the reconcile interval (+5 s), the daemon's fds,
the state directory and the node's links back to what they were before the
ADD.

    netns_gone.py     (CHAOS_RECONCILE=30 edgelinkd's --reconcile-interval;
                       CHAOS_NETNS_LOAD=10 s of load before the deletion;
                       QUICK=1: 5 and 5)
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "soak"))
import common  # noqa: E402
from common import ConnLoad, Held, Sampler, Scenario, lab, links, listening, seconds, sh, state_listing, wait_until  # noqa: E402

RECONCILE = seconds("CHAOS_RECONCILE", 30, 5)
LOAD = seconds("CHAOS_NETNS_LOAD", 10, 5)
PORT, UPORT = 8080, 5000


def main():
    with Scenario("netns") as sc:
        sc.echo_device(lab.IDLE)
        sc.echo_device(lab.UDP, "_udp-echo")
        d = sc.start_daemon("--reconcile-interval", "%g" % RECONCILE)
        time.sleep(1.0)
        fds0, state0, links0 = common.fds_but_pipes(d.pid), state_listing(sc.lab.state), links(lab.NODE)
        code, out, err = sc.add(lab.POD, "chaos-netns", [
            {"name": "api", "protocol": "tcp", "port": PORT, "target": "%s:%d" % (lab.DEV_IP, lab.IDLE)},
            {"name": "telemetry", "protocol": "udp", "port": UPORT, "target": "%s:%d" % (lab.DEV_IP, lab.UDP)}])
        if code != 0:
            raise SystemExit("netns_gone: ADD failed: %s %s" % (out, err))
        wait_until(lambda: listening(lab.POD, PORT), 10)
        fds_served = common.fds_but_pipes(d.pid)
        peer = lambda: "eth0" in links(lab.CLIENT)  # noqa: E731  the pod's eth0 peer
        with Sampler(lambda: d.pid) as smp, \
                ConnLoad(smp.now, "%s:%d" % (lab.POD_IP, PORT)) as load, \
                Held(smp.now, lab.POD_IP, PORT) as held:
            time.sleep(LOAD)
            t_del = smp.now()
            sh("ip", "netns", "del", lab.POD)
            m = lambda: d.metrics()  # noqa: E731
            since = lambda w: None if w is None else smp.now() - t_del  # noqa: E731  from the deletion
            reclaimed = since(wait_until(lambda: m().get("edgelink_reclaimed_attachments_total", 0) >= 1,
                                         RECONCILE + 30, 0.1))
            gone = since(wait_until(lambda: state_listing(sc.lab.state) == state0, 30, 0.1))
            freed = since(wait_until(lambda: not peer(), 30, 0.1))
            node_clean = since(wait_until(lambda: links(lab.NODE) == links0, 30, 0.1))
            time.sleep(3.0)
            t_end = smp.now()
        lost_after = sorted(t - t_del for t in held.lost)
        ok_before = sum(x[2] for x in load.timeline if x[1] <= t_del)
        ok_after = sum(x[2] for x in load.timeline if x[0] >= t_del)
        fail_before = sum(max(0, x[3]) for x in load.timeline if x[1] <= t_del)
        fail_after = sum(max(0, x[3]) for x in load.timeline if x[0] >= t_del)
        last_ok = max((x[1] - t_del for x in load.timeline if x[2] > 0), default=None)
        fds1, state1, links1 = common.fds_but_pipes(d.pid), state_listing(sc.lab.state), links(lab.NODE)
        res = {"reconcile_interval": RECONCILE, "reclaimed_after_s": reclaimed,
               "record_and_reservation_gone_after_s": gone,
               "netns_freed_after_s": freed, "node_links_clean_after_s": node_clean,
               "held_lost_after_deletion_s": lost_after[:20], "held_lost": len(lost_after),
               "load_ok_before": ok_before, "load_failed_before": fail_before,
               "load_ok_after": ok_after, "load_failed_after": fail_after, "last_ok_slice_end_s": last_ok,
               "fds_before_add": fds0, "fds_served": fds_served, "fds_after": fds1,
               "state_leaked": sorted(set(state1) - set(state0)),
               "links_leaked": sorted(set(links1) - set(links0)), "metrics": {k: v for k, v in d.metrics().items()
                                                                            if "reclaim" in k or k == "edgelink_attachments"}}
        common.save("netns_gone", res)

        def draw(ax):
            ax2 = ax.twinx()
            ax2.spines["right"].set_position(("axes", 1.12))
            ax2.bar([x[0] for x in load.timeline], [x[2] for x in load.timeline],
                    width=[x[1] - x[0] for x in load.timeline], align="edge", color="tab:green", alpha=0.4)
            ax2.set_ylabel("connections ok per slice", color="tab:green")
            if reclaimed is not None:
                ax.axvline(t_del + reclaimed, color="tab:red", lw=1)
        fig = common.rss_figure("chaos-netns-gone", "pod netns deleted at %.0f s under load; red: reclaimed after %.1f s"
                                % (t_del, reclaimed or -1), smp, marks=[(t_del, "deleted")], extra=draw)
    common.table("Chaos: the pod's netns deleted under load (--reconcile-interval %g)" % RECONCILE, [
        ("reclaimed by edgelinkd after (s)", "%.1f" % reclaimed if reclaimed is not None else "never"),
        ("record and reservation gone after (s)", "%.1f" % gone if gone is not None else "never"),
        ("netns freed (pod veths gone) after (s)", "%.1f" % freed if freed is not None else "never"),
        ("node links back after (s)", "%.1f" % node_clean if node_clean is not None else "never"),
        ("short connections ok after the deletion", "%d (until %.1f s after)" % (ok_after, last_ok or 0)),
        ("held connections lost", len(lost_after)),
        ("fds before ADD / served / after", "%s / %s / %s" % (common.fmt_fds(fds0), common.fmt_fds(fds_served), common.fmt_fds(fds1))),
        ("state entries / node links leaked", "%d / %d" % (len(res["state_leaked"]), len(res["links_leaked"]))),
        ("figure", fig)])
    bad = (reclaimed is None or reclaimed > RECONCILE + 5 or freed is None or common.fd_leak(fds0, fds1)
           or res["state_leaked"] or res["links_leaked"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
