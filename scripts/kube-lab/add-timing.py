#!/usr/bin/env python3
"""The plugin's ADD on a lab node, timed: make bench-scale runs this in an
edge node's mount and network namespaces (nsenter), so the plugin meets
that node's real state (its bridge, its records, its reservations, the
edgelinkd that serves them), once before the Devices are applied and once
with 500 attachments on the node.

    add-timing.py ROUNDS < netconf.json

Each round: ADD into a namespace of its own (made and removed here, not
timed), then DEL. Prints one line: `add_ms median p95 del_ms median`.
"""
import json
import os
import statistics
import subprocess
import sys
import time

PLUGIN = "/opt/cni/bin/edgelink"


def run(cmd, cid, netns, conf):
    env = {
        "CNI_COMMAND": cmd,
        "CNI_CONTAINERID": cid,
        "CNI_NETNS": netns,
        "CNI_IFNAME": "net1",
        "CNI_PATH": "/opt/cni/bin",
        "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=" + cid,
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
    }
    t = time.perf_counter()
    p = subprocess.run([PLUGIN], input=conf, env=env, capture_output=True, text=True)
    dt = (time.perf_counter() - t) * 1000
    if p.returncode != 0:
        sys.exit("%s %s failed (%d): %s" % (cmd, cid, p.returncode, p.stdout + p.stderr))
    return dt


def main():
    rounds = int(sys.argv[1])
    conf = sys.stdin.read()
    json.loads(conf)
    adds, dels = [], []
    for i in range(rounds):
        name = "elk-add-timing-%d-%d" % (os.getpid(), i)
        subprocess.run(["ip", "netns", "add", name], check=True)
        try:
            cid = "addtiming%d%d" % (os.getpid(), i)
            adds.append(run("ADD", cid, "/run/netns/" + name, conf))
            dels.append(run("DEL", cid, "/run/netns/" + name, conf))
        finally:
            subprocess.run(["ip", "netns", "del", name], check=False)
    adds.sort()
    p95 = adds[min(len(adds) - 1, int(0.95 * len(adds)))]
    print("add_ms %.2f %.2f del_ms %.2f" % (statistics.median(adds), p95, statistics.median(dels)))


if __name__ == "__main__":
    main()
