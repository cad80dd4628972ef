#!/usr/bin/env python3
"""A/B of the plugin's ADD / CHECK / DEL: two edgelink binaries and the
reference plugin they are measured against, in one lab of cni.py, each
round running every subject once (the order rotating by one each round),
so the machine's drift hits all alike.

    cni_ab.py --base BIN [--new BIN] [--rounds 200] [--mode bridge|macvlan] [--journaled]

--new defaults to EDGELINK_BIN (cni.py's: target/release/edgelink). Both
builds run one config with one state directory, served by one edgelinkd
(EDGELINKD_BIN), as on a node: only the binary differs. Prints each
subject's medians and p95 and each build's ratio to the reference.

--journaled puts the state directories (both builds' and host-local's) on
a journaled ext4 in a loop device, as a node's /var/lib is, instead of the
machine's temp directory (here an ext4 without a journal, where a sync
costs less and a new inode more).
"""
import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time

import cni


def subjects(state, base, new, mode):
    """The new build, the base build (one config, one state directory and
    one daemon: only the binary differs) and the reference."""
    elk, ref = cni.subjects(state)[0 if mode == "bridge" else 1]
    return [cni.Subject("edgelink %s (new)" % mode, new, elk.conf),
            cni.Subject("edgelink %s (base)" % mode, base, elk.conf), ref]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="the base build's edgelink binary")
    ap.add_argument("--new", default=cni.ELK, help="the build measured against it")
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--mode", choices=("bridge", "macvlan"), default="bridge")
    ap.add_argument("--settle", type=float, default=0.05,
                    help="seconds between cycles: the daemon deletes a DEL's link in the background")
    ap.add_argument("--journaled", action="store_true",
                    help="the state on a journaled ext4 in a loop device (as a node's /var/lib)")
    a = ap.parse_args()
    disk = Journaled() if a.journaled else None
    try:
        measure(a, disk.path if disk else None)
    finally:
        if disk:
            disk.close()


class Journaled:
    """A 512 MiB sparse image with a journaled ext4, loop-mounted."""

    def __init__(self):
        self.work = tempfile.mkdtemp(prefix="edgelink-cni-ab-disk-")
        image, self.path = os.path.join(self.work, "disk.img"), os.path.join(self.work, "mnt")
        os.mkdir(self.path)
        with open(image, "wb") as f:
            f.truncate(512 << 20)
        subprocess.run(["mkfs.ext4", "-q", "-F", image], check=True)
        subprocess.run(["mount", "-o", "loop", image, self.path], check=True)

    def close(self):
        subprocess.run(["umount", self.path], check=False)
        shutil.rmtree(self.work, ignore_errors=True)


def measure(a, under):
    state = tempfile.mkdtemp(prefix="edgelink-cni-ab-", dir=under)
    lab = cni.Lab(pods=16)
    daemon = None
    try:
        cni.setns(cni.NODE)
        # Both binaries run from one directory: where a binary lies was
        # worth 10-15% in an A/A run (the same binary from target/ and /tmp).
        bins = []
        for name, path in (("new", a.new), ("base", a.base)):
            bins.append(os.path.join(state, "edgelink-" + name))
            shutil.copy(path, bins[-1])
        subs = subjects(state, bins[1], bins[0], a.mode)
        daemon = cni.start_daemon(subs[0].conf["stateDir"])
        res = {s.name: {"ADD": [], "CHECK": [], "DEL": []} for s in subs}
        for r in range(a.rounds):
            k = r % len(subs)
            for s in subs[k:] + subs[:k]:
                add, chk, dele = s.cycle("ab-%d-%d" % (r, subs.index(s)), lab.pods[r % len(lab.pods)])
                res[s.name]["ADD"].append(add)
                res[s.name]["CHECK"].append(chk)
                res[s.name]["DEL"].append(dele)
                time.sleep(a.settle)
    finally:
        if daemon is not None:
            daemon.terminate()
            daemon.wait(timeout=30)
        lab.close()
        shutil.rmtree(state, ignore_errors=True)
    print("%s, %d rounds, state on %s, on %s" % (a.mode, a.rounds, "a journaled ext4 (loop)" if under else "the temp directory", cni.machine()))
    print("| subject | ADD median | ADD p95 | CHECK median | DEL median |")
    print("|---|---|---|---|---|")
    for name, r in res.items():
        print("| %s | %s | %s | %s | %s |" % (name, cni.fmt_ms(statistics.median(r["ADD"])), cni.fmt_ms(cni.pct(r["ADD"], 95)),
              cni.fmt_ms(statistics.median(r["CHECK"])), cni.fmt_ms(statistics.median(r["DEL"]))))
    ref = statistics.median(res[subs[2].name]["ADD"])
    for s in subs[:2]:
        print("%s: ADD %.3f× the reference" % (s.name, statistics.median(res[s.name]["ADD"]) / ref))


if __name__ == "__main__":
    main()
