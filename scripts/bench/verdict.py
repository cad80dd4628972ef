"""What makes a bench run fail (both halves, QUICK=1 included).

The figures are measurements, but some of them say the relay or the plugin
is broken, whatever the machine's speed:

- edgelinkd fails short connections: more than CONN_FAILED_MAX of the
  attempts of a round of the short-connection measure (elk-loadgen
  conn-rate: connect, 64 bytes each way, close; 2 s timeouts);
- edgelinkd cannot hold idle connections: more than IDLE_FAILED_MAX of the
  idle connections fail to open or to echo their 64 bytes;
- edgelinkd drops datagrams at a load well within its capacity: more than
  UDP_LOSS_MAX lost at UDP_CHECK_LOAD (one client, 1400-byte datagrams at
  5 000/s; the overload figures, where the direct path loses too, are
  figures, not checks);
- edgelinkd does not complete every client of a burst against the fragile
  device (fragile.py: a listen backlog of 5, one accept per 5 ms; N clients
  connect at once, each sends 64 bytes and reads them back): a forward with
  `maxConnections` queues what the device cannot take yet, so every client
  must complete within the burst's timeout (the figures fragile<N>_completed,
  one per burst of N clients);
- edgelink's own CHECK fails (any CHECK of an edgelink subject).

The relay checks apply to all of edgelinkd's subjects: the relay
("edgelinkd"), its kernel path ("edgelinkd kernel path": the kernel
forwards the connections and datagrams, but a table that loses them is
edgelinkd's), and its reverse forwards ("reverse: edgelinkd", reverse.py:
short connections from the device to the cluster through the pod).

The peers' (socat, HAProxy, nginx, the reference plugins) failures are
reported beside, never fatal: they are what is compared against, not what
is tested. Pure functions over the results, so that the failure path is
tested without a broken relay (scripts/bench/test_verdict.py).
"""
import re

CONN_FAILED_MAX = 0.001
IDLE_FAILED_MAX = 0.001
UDP_LOSS_MAX = 0.01
# key, clients, offered datagrams/s
UDP_CHECK_LOAD = ("ucheck", 1, 5000)
RELAY = "edgelinkd"
KERNEL = "edgelinkd kernel path"
REVERSE = "reverse: edgelinkd"  # reverse.py: device -> pod net1 -> cluster
OURS = (RELAY, KERNEL, REVERSE)
# fragile<N>_completed: clients that completed, per burst of N clients
FRAGILE_COMPLETED = re.compile(r"^fragile(\d+)_completed$")


def _share(bad, good):
    total = bad + good
    return bad / total if total else 0.0


def _pct(x):
    return "%.2f%%" % (x * 100)


def relay_checks(results, peers):
    """(failures, notes) of a relay run. `results` maps a subject's name to
    {figure: [value per round]}; `peers` names the subjects whose failures
    are only noted. Figures that were not measured are not checked."""
    failures, notes = [], []
    for name, r in sorted(results.items()):
        out = failures if name in OURS else notes
        if name not in OURS and name not in peers:
            continue
        fails, oks = r.get("conn_failed", []), r.get("conn_ok", [])
        for i, (f, ok) in enumerate(zip(fails, oks)):
            share = _share(f, ok)
            if share > CONN_FAILED_MAX:
                out.append("short connections (conn_failed), round %d: %s failed %d of %d connections (%s; bound %s)"
                           % (i + 1, name, f, f + ok, _pct(share), _pct(CONN_FAILED_MAX)))
        for f, ok in zip(r.get("idle_failed", []), r.get("idle_conns", [])):
            share = _share(f, ok)
            if share > IDLE_FAILED_MAX:
                out.append("idle connections (idle_failed): %s failed %d of %d (%s; bound %s)"
                           % (name, f, f + ok, _pct(share), _pct(IDLE_FAILED_MAX)))
        key, clients, rate = UDP_CHECK_LOAD
        for i, loss in enumerate(r.get(key + "_loss", [])):
            if loss > UDP_LOSS_MAX:
                out.append("UDP at %d/s from %d client (%s_loss), round %d: %s lost %s of the datagrams (bound %s)"
                           % (rate, clients, key, i + 1, name, _pct(loss), _pct(UDP_LOSS_MAX)))
        for key in sorted(r, key=lambda k: (len(k), k)):
            m = FRAGILE_COMPLETED.match(key)
            if not m:
                continue
            n = int(m.group(1))
            for i, done in enumerate(r[key]):
                if done < n:
                    out.append("fragile device, burst of %d clients (%s), run %d: %s completed %d of %d "
                               "(%s failed; bound: all)" % (n, key, i + 1, name, done, n, _pct(_share(n - done, done))))
    return failures, notes


def cni_checks(check_failures):
    """(failures, notes) of a CNI run. `check_failures` maps a subject's
    name to the error outputs of its failed CHECKs; subjects whose name
    starts with "edgelink" are edgelink's own."""
    failures, notes = [], []
    for name, errs in sorted(check_failures.items()):
        if not errs:
            continue
        line = "CHECK of %s failed %d time%s, e.g. `%s`" % (
            name, len(errs), "" if len(errs) == 1 else "s", errs[0].replace("\n", " ")[:200])
        (failures if name.startswith("edgelink") else notes).append(line)
    return failures, notes


def section(title, failures, notes):
    """The checks as Markdown lines for the report."""
    lines = ["### %s" % title, ""]
    if not failures:
        lines.append("All checks passed (bounds: scripts/bench/verdict.py).")
    for f in failures:
        lines.append("- **FAILED**: " + f)
    for n in notes:
        lines.append("- peer, not fatal: " + n)
    lines.append("")
    return lines
