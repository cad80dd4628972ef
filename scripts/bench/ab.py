#!/usr/bin/env python3
"""A/B of edgelinkd: a base revision's binaries against the working tree's,
run after one another in fresh labs of relay.py, N pairs, each build
first in every other pair.

    ab.py --base REV [--measures rr,udp] [--pairs 6] [--only edgelinkd]

Both are built as shipped (static, release). The base is built once in a
git worktree under /var/tmp/edgelink-ab/<commit> (its own target dir) and
kept there, so that a second A/B against it only builds the working tree.
Each run is `relay.py --rounds 1` with the measures asked for; the figures
edgelinkd printed are collected per run, and the summary gives each figure
of both builds, run by run, with the median.

One run of a measure on this 2-core machine says little: the client, the
relay and the device's services share the cores, and some measures (UDP
beyond capacity) land in one of two modes from run to run. Alternating
pairs put the machine's drift on both builds alike.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
CACHE = "/var/tmp/edgelink-ab"


def host():
    out = subprocess.run(["rustc", "-vV"], capture_output=True, text=True, check=True).stdout
    return re.search(r"^host: (\S+)", out, re.M).group(1)


def build(src, target_dir, packages):
    """Static release binaries of `packages` from `src` into `target_dir`."""
    env = dict(os.environ, RUSTFLAGS="-C target-feature=+crt-static", CARGO_TARGET_DIR=target_dir)
    cmd = ["cargo", "build", "--release", "--target", host()]
    for p in packages:
        cmd += ["-p", p]
    print("ab: building %s in %s" % (" ".join(packages), src), flush=True)
    subprocess.run(cmd, cwd=src, env=env, check=True)
    return os.path.join(target_dir, host(), "release")


def base_bins(rev):
    """The base revision's plugin and daemon, built once and cached."""
    commit = subprocess.run(["git", "rev-parse", "--verify", rev + "^{commit}"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.strip()
    tree = os.path.join(CACHE, commit)
    bins = os.path.join(tree, "target", host(), "release")
    if not all(os.access(os.path.join(bins, b), os.X_OK) for b in ("edgelink", "edgelinkd")):
        if not os.path.isdir(tree):
            os.makedirs(CACHE, exist_ok=True)
            subprocess.run(["git", "worktree", "add", "--detach", tree, commit], cwd=ROOT, check=True)
        build(tree, os.path.join(tree, "target"), ["edgelink", "edgelinkd"])
    return commit[:10], bins


FIGURE = re.compile(r"(\w+)=([-+0-9.e]+)")


def run(bins, loadgen, measures, only, args, subject="edgelinkd"):
    """One relay.py run; {figure: value} of what `subject` printed, and
    direct's figures as direct_<figure> with <figure>_vs_direct, the
    subject's ratio to direct in the same round."""
    env = dict(os.environ, EDGELINK_BIN=os.path.join(bins, "edgelink"),
               EDGELINKD_BIN=os.path.join(bins, "edgelinkd"), LOADGEN_BIN=loadgen)
    if args:
        env["EDGELINKD_ARGS"] = args
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts/bench/relay.py"),
                          "--only", only, "--measures", measures, "--rounds", "1"],
                         env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise SystemExit("ab: relay.py failed:\n" + out.stdout[-2000:] + out.stderr[-2000:])
    got, direct = {}, {}
    for line in out.stdout.splitlines():
        if line.startswith("idle connections "):
            # "idle connections <subject>: figures", one line per subject.
            line = "round 1 idle: " + line[len("idle connections "):].replace(": ", " ", 1)
        if not line.startswith("round "):
            continue
        for part in line.split(": ", 1)[1].split("; "):
            first = FIGURE.search(part)
            name = part[:first.start()].strip() if first else ""
            figures = [(k, float(v)) for k, v in FIGURE.findall(part)]
            if name == subject:
                got.update(figures)
            elif name == "direct" and subject != "direct":
                direct.update(figures)
    for k, v in direct.items():
        got["direct_" + k] = v
        if got.get(k) and v:
            got[k + "_vs_direct"] = got[k] / v
    return got


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True, help="git revision to compare against")
    ap.add_argument("--measures", default="rr,udp", help="relay.py --measures")
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--only", default="edgelinkd", help="relay.py --only (edgelinkd always runs)")
    ap.add_argument("--subject", default="edgelinkd",
                    help="whose figures to compare, e.g. \"edgelinkd kernel path\" (with --only ...,kernel)")
    ap.add_argument("--args", default=os.environ.get("EDGELINKD_ARGS", ""),
                    help="extra edgelinkd arguments, for both builds")
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("ab: run as root (relay.py builds network namespaces)")
    name, base = base_bins(a.base)
    here = build(ROOT, os.path.join(ROOT, "target"), ["edgelink", "edgelinkd", "edgelink-loadgen"])
    loadgen = os.path.join(here, "elk-loadgen")
    runs = {"base": [], "tree": []}
    for i in range(a.pairs):
        # Each build goes first in every other pair: what the first run of
        # a pair leaves (a warm page cache, a cooler CPU) favours neither.
        order = [("base", base), ("tree", here)]
        for which, bins in (order if i % 2 == 0 else order[::-1]):
            got = run(bins, loadgen, a.measures, a.only, a.args, a.subject)
            runs[which].append(got)
            print("pair %d %s: %s" % (i + 1, which, " ".join("%s=%.4g" % kv for kv in sorted(got.items()))),
                  flush=True)
    print("\nbase %s, tree = working tree; %d pairs of `relay.py --only %s --measures %s --rounds 1`%s; "
          "figures of %s" % (name, a.pairs, a.only, a.measures,
                             " with EDGELINKD_ARGS=%r" % a.args if a.args else "", a.subject))
    print("%-14s %-6s %10s  %s" % ("figure", "build", "median", "runs"))
    for key in sorted(set().union(*runs["base"], *runs["tree"])):
        for which in ("base", "tree"):
            vals = [r[key] for r in runs[which] if key in r]
            if vals:
                print("%-14s %-6s %10.4g  %s" % (key, which, statistics.median(vals),
                                                 " ".join("%.4g" % v for v in vals)))


if __name__ == "__main__":
    main()
