#!/usr/bin/env python3
"""Soak: PODS attachments added and deleted in a loop for SECONDS.

Each cycle creates PODS pod netns, runs the plugin's ADD in each (bridge
mode, a TCP and a UDP forward, built-in IPAM; new container IDs every
cycle, the same pod names pod-0.. as a StatefulSet's), waits until edgelinkd
listens for every forward, runs every DEL, deletes the netns, and waits
until the daemon serves nothing and the state directory and the node's
links are back to what they were before the first cycle.

Checks: edgelinkd's RSS flat after the first cycle (the warm-up), no fd
leaked, no record or IPAM reservation left, no link left in the node netns.

    attach_loop.py            (SOAK_ATTACH_SECONDS=1800, SOAK_ATTACH_PODS=1000;
                               QUICK=1: 15 s, 100 pods)
"""
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import Sampler, Scenario, cni, lab, links, seconds, state_listing, wait_until  # noqa: E402

SECS = seconds("SOAK_ATTACH_SECONDS", 1800, 15)
PODS = int(os.environ.get("SOAK_ATTACH_PODS", "100" if common.QUICK else "1000"))
TARGET = "172.20.3.250"
FORWARDS = [{"name": "api", "protocol": "tcp", "port": 8080, "target": TARGET + ":7000"},
            {"name": "telemetry", "protocol": "udp", "port": 5000, "target": TARGET + ":7001"}]
# SOAK_ATTACH_FORWARDS=tcp or udp keeps that forward only (to tell which
# one a growth comes from).
FORWARDS = [f for f in FORWARDS if os.environ.get("SOAK_ATTACH_FORWARDS", f["protocol"]) == f["protocol"]]


def conf(state):
    return {"cniVersion": "1.0.0", "name": "soak-attach", "type": "edgelink", "mode": "bridge",
            "bridge": "edge0", "uplink": "uplink0", "stateDir": state,
            "ipam": {"ranges": [[{"subnet": "172.20.0.0/22", "rangeStart": "172.20.0.10",
                                  "rangeEnd": "172.20.3.245"}]], "nodeName": "soak"},
            "forwards": FORWARDS}


def batch(lines):
    p = subprocess.run(["ip", "-force", "-batch", "-"], input="\n".join(lines) + "\n",
                       capture_output=True, text=True, timeout=600)
    return p.returncode, p.stderr[-400:]


def serving(daemon):
    """(attachments, forwards listening) in /status."""
    st = daemon.status()
    atts = st.get("attachments", [])
    live = sum(1 for a in atts for f in a.get("forwards", []) if f.get("listener") == "listening")
    return len(atts), live


def main():
    with Scenario("attach") as sc:
        sh = common.sh
        sh("ip", "-n", lab.DEV, "addr", "add", TARGET + "/22", "dev", "sw0")
        d = sc.start_daemon()
        state = sc.lab.state
        c = conf(state)
        pods = ["%s-p%d" % (lab.TAG, i) for i in range(PODS)]
        sc.cleanups.append(lambda: batch(["netns del " + p for p in pods]))
        time.sleep(1.0)
        base_state, base_links, base_fds = state_listing(state), links(lab.NODE), common.fd_count(d.pid)
        cycles, failures = [], []
        with Sampler(lambda: d.pid) as smp:
            t_end = smp.now() + SECS
            n = 0
            while smp.now() < t_end:
                cyc = {"n": n, "t0": smp.now()}
                rc, err = batch(["netns add " + p for p in pods])
                if rc != 0:
                    failures.append("cycle %d: netns add: %s" % (n, err))
                t = time.monotonic()
                for i, p in enumerate(pods):
                    code, out, errout = cni("ADD", c, "c%d-%d" % (n, i), p, pod="pod-%d" % i)
                    if code != 0:
                        failures.append("cycle %d ADD %d: %s %s" % (n, i, out, errout[-200:]))
                cyc["add_s"] = time.monotonic() - t
                cyc["up_s"] = wait_until(lambda: serving(d) == (PODS, len(FORWARDS) * PODS), 120, 0.5)
                cyc["peak"] = serving(d)
                cyc["t_peak"], cyc["rss_peak"], cyc["fds_peak"] = smp.now(), common.rss_kb(d.pid), common.fd_count(d.pid)
                t = time.monotonic()
                for i, p in enumerate(pods):
                    code, out, errout = cni("DEL", c, "c%d-%d" % (n, i), p, pod="pod-%d" % i)
                    if code != 0:
                        failures.append("cycle %d DEL %d: %s %s" % (n, i, out, errout[-200:]))
                cyc["del_s"] = time.monotonic() - t
                rc, err = batch(["netns del " + p for p in pods])
                if rc != 0:
                    failures.append("cycle %d: netns del: %s" % (n, err))
                cyc["down_s"] = wait_until(lambda: serving(d)[0] == 0 and state_listing(state) == base_state
                                           and links(lab.NODE) == base_links, 120, 0.5)
                if cyc["down_s"] is None:
                    failures.append("cycle %d: not back to the start within 120 s: %s serving, state %s, links +%s"
                                    % (n, serving(d), sorted(set(state_listing(state)) - set(base_state))[:5],
                                       sorted(set(links(lab.NODE)) - set(base_links))[:5]))
                time.sleep(1.0)
                cyc["t_end"], cyc["rss_end"], cyc["fds_end"] = smp.now(), common.rss_kb(d.pid), common.fd_count(d.pid)
                cycles.append(cyc)
                print("cycle %d: ADD %.1f s, up %s s, DEL %.1f s, down %s s, RSS peak %d KiB end %d KiB, fds %s/%s"
                      % (n, cyc["add_s"], cyc["up_s"], cyc["del_s"], cyc["down_s"], cyc["rss_peak"],
                         cyc["rss_end"], cyc["fds_peak"], cyc["fds_end"]), flush=True)
                n += 1
        end_state, end_links, end_fds = state_listing(state), links(lab.NODE), common.fd_count(d.pid)
        left_ns = [p for p in sh("ip", "netns", "list").stdout.split() if p in pods]
        troughs = [(cy["t_end"], cy["rss_end"]) for cy in cycles[1:]]
        res = {
            "pods": PODS, "seconds": SECS, "cycles": len(cycles), "attachments": PODS * len(cycles),
            "failures": failures[:20], "failure_count": len(failures),
            "rss_warm_kb": cycles[0]["rss_end"] if cycles else None,
            "rss_end_kb": cycles[-1]["rss_end"] if cycles else None,
            "rss_peak_first_kb": cycles[0]["rss_peak"] if cycles else None,
            "rss_peak_last_kb": cycles[-1]["rss_peak"] if cycles else None,
            "slope_kb_min": common.slope_kb_per_min(troughs),
            "slope_second_half_kb_min": common.second_half_slope(troughs),
            "fds_before": base_fds, "fds_after": end_fds,
            "state_leaked": sorted(set(end_state) - set(base_state)),
            "links_leaked": sorted(set(end_links) - set(base_links)), "netns_left": left_ns,
            "sticky_entries": common.sticky_count(state),
            "add_s_median": sorted(cy["add_s"] for cy in cycles)[len(cycles) // 2] if cycles else None,
            "del_s_median": sorted(cy["del_s"] for cy in cycles)[len(cycles) // 2] if cycles else None,
            "cycle_list": cycles,
        }
        common.save("attach_loop", res)
        fig = common.rss_figure(
            "soak-attach-loop", "%d attachments added and deleted in a loop, %d cycles in %.0f min"
            % (PODS, len(cycles), SECS / 60), smp,
            marks=[(cy["t_peak"], "peak") for cy in cycles])
    common.table("Soak: %d attachments added and deleted in a loop" % PODS, [
        ("cycles (ADD ×%d, DEL ×%d)" % (PODS, PODS), res["cycles"]),
        ("plugin or netns failures", res["failure_count"]),
        ("RSS after cycle 1 / at the end (KiB)", "%s / %s" % (res["rss_warm_kb"], res["rss_end_kb"])),
        ("RSS at peak, cycle 1 / last (KiB)", "%s / %s" % (res["rss_peak_first_kb"], res["rss_peak_last_kb"])),
        ("RSS slope after cycle 1 / over its second half (KiB/min)",
         "%.1f / %.1f" % (res["slope_kb_min"], res["slope_second_half_kb_min"])),
        ("fds before / after", "%s / %s" % (base_fds, end_fds)),
        ("state entries leaked", len(res["state_leaked"])),
        ("node links leaked", len(res["links_leaked"])),
        ("sticky entries (one per pod name, by design)", res["sticky_entries"]),
        ("median ADD / DEL of all pods (s)", "%.1f / %.1f" % (res["add_s_median"] or 0, res["del_s_median"] or 0)),
        ("figure", fig)])
    for f in failures[:10]:
        print("FAIL:", f)
    bad = failures or res["state_leaked"] or res["links_leaked"] or left_ns or end_fds != base_fds
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
