#!/usr/bin/env python3
"""Chaos: the state directory full (ENOSPC) during ADD.

The state dir is a small tmpfs mounted on a temp dir (unmounted at the
end, also on failure), served by edgelinkd. Before each ADD a filler takes
all the space but K pages (K = 0..8), or all the inodes but K; every ADD
so meets ENOSPC at another of its writes (IPAM reservation, its cursor, the
record, their temp files) or succeeds.

Checks: a failed ADD returns a CNI error (JSON on stdout with a code and a
message that says what was full) and leaves nothing behind: no file in the
state dir, no link in the pod or on the node; the runtime's DEL that
follows succeeds; a successful ADD's DEL cleans up; edgelinkd still serves.

    enospc.py
"""
import errno
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "soak"))
import common  # noqa: E402
from common import Scenario, cni, lab, links, sh  # noqa: E402

FILLER = ".filler"


def fill_bytes(d, leave_pages):
    """Fill the fs with one file, then give back `leave_pages` pages."""
    path = os.path.join(d, FILLER + "-bytes")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        block = b"\0" * 4096
        while True:
            os.write(fd, block)
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
    finally:
        os.close(fd)
    size = os.path.getsize(path)
    os.truncate(path, max(0, size - leave_pages * 4096))


def fill_inodes(d, leave):
    """Take every inode with empty files, then give back `leave` of them."""
    fd = os.path.join(d, FILLER + "-inodes")
    os.makedirs(fd, exist_ok=True)
    made = []
    try:
        while True:
            p = os.path.join(fd, str(len(made)))
            open(p, "w").close()
            made.append(p)
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
    for p in made[len(made) - leave:] if leave else []:
        os.unlink(p)


def unfill(d):
    sh("rm", "-rf", os.path.join(d, FILLER + "-bytes"), os.path.join(d, FILLER + "-inodes"))


def listing(d):
    return [p for p in common.state_listing(d) if not p.startswith(FILLER)]


def stage(row):
    """Which write of the ADD met ENOSPC, from the error's path."""
    if row["add_exit"] == 0:
        return "ADD ok"
    msg = (row.get("error") or {}).get("msg", "")
    if "/owners/" in msg:
        return "owner index"
    if "/attachments/" in msg:
        return "record"
    if "/ipam/" in msg:
        return "reservation"
    return "other"


STAGES = ["owner index", "reservation", "record", "other", "ADD ok"]


def figure(rows):
    """One dot per case: where the ADD failed (or that it passed); green
    when it left nothing behind and its DEL cleaned up, red otherwise."""
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(8, 2.8))
    for i, r in enumerate(rows):
        clean = not (r.get("left_in_state") or r.get("left_in_pod") or r.get("left_on_node")
                     or r["del_exit"] or r["after_del_left"] or r["pod_links_after_del"])
        ax.scatter([i], [STAGES.index(stage(r))], s=60, color="tab:green" if clean else "tab:red")
    ax.set_yticks(range(len(STAGES)))
    ax.set_yticklabels(["ENOSPC at " + s if s != "ADD ok" else s for s in STAGES])
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([r["case"].replace(" free", "") for r in rows], rotation=30, ha="right")
    ax.set_xlabel("space left before the ADD (pages of 4 KiB, or inodes)")
    ax.set_title("ADD with the state dir full: where it failed; green = nothing left behind, DEL clean")
    fig.tight_layout()
    path = common.figure_path("chaos-enospc")
    fig.savefig(path)
    plt.close(fig)
    return path


def main():
    with Scenario("enospc") as sc:
        mnt = os.path.join(sc.tmp, "statefs")
        os.makedirs(mnt)
        # 8192 inodes: enough for the store, few enough to fill quickly.
        sh("mount", "-t", "tmpfs", "-o", "size=512k,nr_inodes=8192,mode=0700", "tmpfs", mnt)
        sc.cleanups.append(lambda: sh("umount", mnt, check=False).returncode == 0 or sh("umount", "-l", mnt, check=False))
        d = sc.start_daemon(state=mnt)
        forwards = [{"name": "api", "protocol": "tcp", "port": 8080, "target": "%s:%d" % (lab.DEV_IP, lab.IDLE)}]
        conf = {"cniVersion": "1.0.0", "name": "chaos-enospc", "type": "edgelink", "mode": "bridge",
                "bridge": "edge0", "uplink": "uplink0", "stateDir": mnt,
                "ipam": {"ranges": [[{"subnet": "172.17.16.0/24", "rangeStart": "172.17.16.200",
                                      "rangeEnd": "172.17.16.250"}]], "nodeName": "soak"},
                "forwards": forwards}
        # One ADD and DEL with room, so that the store's directories exist
        # (as on a node that has run pods) and the first fill hits the
        # per-attachment writes.
        ns = lab.TAG + "-e"
        sh("ip", "netns", "add", ns)
        sc.cleanups.append(lambda: sh("ip", "netns", "del", ns, check=False))
        code, out, err = cni("ADD", conf, "warm", ns)
        assert code == 0, (out, err)
        assert cni("DEL", conf, "warm", ns)[0] == 0
        time.sleep(0.5)
        base, node0 = listing(mnt), links(lab.NODE)
        rows, bad = [], []
        cases = [("bytes", k) for k in (0, 1, 2, 3, 4, 6, 8)] + [("inodes", k) for k in (0, 1, 2, 3)]
        for i, (kind, k) in enumerate(cases):
            (fill_bytes if kind == "bytes" else fill_inodes)(mnt, k)
            cid = "full-%s-%d" % (kind, k)
            code, out, err = cni("ADD", conf, cid, ns)
            row = {"case": "%s, %d free" % (kind, k), "add_exit": code}
            if code != 0:
                row["error"] = out if isinstance(out, dict) else {"raw": str(out)[:300]}
                left = sorted(set(listing(mnt)) - set(base))
                pod_links = [l for l in links(ns) if l != "lo"]
                node_left = sorted(set(links(lab.NODE)) - set(node0))
                row.update({"left_in_state": left, "left_in_pod": pod_links, "left_on_node": node_left})
                clear = isinstance(out, dict) and "code" in out and "msg" in out
                row["clear_error"] = clear
                if not clear or left or pod_links or node_left:
                    bad.append(row)
            unfill(mnt)
            dcode, dout, derr = cni("DEL", conf, cid, ns)
            row["del_exit"] = dcode
            time.sleep(0.3)
            row["after_del_left"] = sorted(set(listing(mnt)) - set(base))
            row["pod_links_after_del"] = [l for l in links(ns) if l != "lo"]
            if dcode != 0 or row["after_del_left"] or row["pod_links_after_del"]:
                bad.append(row)
                row["del_error"] = dout if isinstance(dout, dict) else str(dout)[:300]
            rows.append(row)
            print(json.dumps(row), flush=True)
        alive = d.p.poll() is None
        served = d.status() if alive else None
        res = {"cases": rows, "daemon_alive": alive, "daemon_attachments_after": len((served or {}).get("attachments", [])),
               "failed_checks": len(bad)}
        common.save("enospc", res)
        fig = figure(rows)
    failed = [r for r in rows if r["add_exit"] != 0]
    common.table("Chaos: the state dir full during ADD (tmpfs of 512 KiB, 8192 inodes)", [
        ("cases / ADDs that failed with ENOSPC", "%d / %d" % (len(rows), len(failed))),
        ("failed ADDs with a CNI error (code + msg)", sum(1 for r in failed if r.get("clear_error"))),
        ("failed ADDs that left a file / a pod link / a node link",
         "%d / %d / %d" % (sum(1 for r in failed if r["left_in_state"]), sum(1 for r in failed if r["left_in_pod"]),
                           sum(1 for r in failed if r["left_on_node"]))),
        ("DELs that failed or left something", sum(1 for r in rows if r["del_exit"] or r["after_del_left"])),
        ("edgelinkd alive after", alive),
        ("figure", fig),
        ("error messages", "; ".join(sorted({"%s: %s" % (r["case"], (r.get("error") or {}).get("msg", "?"))
                                             for r in failed})[:3]))])
    return 1 if bad or not alive else 0


if __name__ == "__main__":
    sys.exit(main())
