"""Short connections sustained round after round, the device closing
first (as an HTTP server with `Connection: close` does): the device then
holds every connection's TIME_WAIT (60 s), and a path that translates
source ports (the kernel path's masquerade) must keep finding ones the
device takes as new, round after round. One round of a few seconds hides
that: an outside run saw the kernel path at 5265 then 1135 connections/s
in consecutive rounds while direct stayed at ~8050.

The subjects with the closing echo (direct, edgelinkd, its kernel path;
the peers do not serve it) alternate within each round, so each one's
rounds are a few seconds apart and the state a round leaves (TIME_WAIT,
conntrack) is there for the next.
"""
from lab import CLOSE, CLOSE_REQUEST, LOADGEN, run_json

CONCURRENCY = 64


def subjects_of(subjects):
    return [s for s in subjects if s.ports.get(CLOSE)]


def one(s, secs):
    r = run_json(s.client, [LOADGEN, "conn-rate", "%s:%d" % (s.host, s.ports[CLOSE]),
                            "--concurrency", str(CONCURRENCY), "--seconds", str(secs),
                            "--size", str(CLOSE_REQUEST), "--server-closes"], secs + 30)
    return {"sustained_conn_s": r["per_second"], "sustained_failed": r["failed"]}


def run(subjects, rounds, secs, measure, results, errors):
    """`rounds` rounds of `secs` seconds through each subject with the
    closing echo, the subjects alternating (relay.py's `measure`)."""
    picked = subjects_of(subjects)
    for r in range(rounds):
        k = r % len(picked)
        measure(r, "sustained short connections", lambda s: one(s, secs), picked[k:] + picked[:k],
                results, errors)
    return picked


def section(picked, results, rounds, secs):
    """The per-round table and the kernel path's ratio to direct in each."""
    lines = ["### Short connections, sustained (the device closes first)", "",
             "%d rounds of %d s, %d connections at a time (`elk-loadgen conn-rate --server-closes` against "
             "`elk-loadgen echo-server --close-after %d` on the device: one request, then the device closes "
             "first and holds the TIME_WAIT); the subjects alternate within each round. Connections/s in "
             "each round:" % (rounds, secs, CONCURRENCY, CLOSE_REQUEST), ""]
    lines.append("| subject | " + " | ".join("round %d" % (i + 1) for i in range(rounds)) + " | failed |")
    lines.append("|---|" + "---|" * (rounds + 1))
    for s in picked:
        got = results[s.name].get("sustained_conn_s", [])
        cells = ["%.0f" % v for v in got] + ["–"] * (rounds - len(got))
        lines.append("| %s | %s | %d |" % (s.name, " | ".join(cells),
                                           sum(results[s.name].get("sustained_failed", []))))
    direct = results.get("direct", {}).get("sustained_conn_s", [])
    for s in picked:
        if s.name == "direct":
            continue
        got = results[s.name].get("sustained_conn_s", [])
        ratios = [g / d for g, d in zip(got, direct) if d]
        if ratios:
            lines.append("| *%s ÷ direct* | %s | worst %.2f× |" % (
                s.name, " | ".join("%.2f×" % x for x in ratios), min(ratios)))
    lines.append("")
    return lines
