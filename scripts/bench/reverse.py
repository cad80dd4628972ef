"""The reverse direction (issue 14): the device calls a service of the
cluster through the pod, device -> pod net1 -> cluster, measured beside
the forward direction's TCP figures.

    device 172.17.16.120 --segment-- pod net1 (edgelinkd's reverse
                                     forwards; HAProxy bound to net1)
    pod eth0 10.244.1.10 --veth-- client netns 10.244.1.20 (the cluster's
                                     iperf3 and TCP echo)

edgelinkd serves reverse forwards that the lab's plugin ADD declares
(entries(): listeners on net1's address only, connecting from the pod
netns through eth0, as the pod). The peer is HAProxy with 1 MiB pipes, as
in the forward direction, bound to net1's address in the pod netns with
the cluster's services as its servers. The load runs in the device netns
with the forward direction's commands for one TCP stream (throughput.py)
and short connections (connections.py); relay.py runs one round of them
within each of its rounds, the subjects alternating.

This module starts the cluster's services and the peer, names the measures
and writes its table; it does not build the lab (lab.py) nor decide what
fails the run (verdict.py, which counts "reverse: edgelinkd" as
edgelinkd's).
"""
from connections import conn_rate
from lab import CLIENT, CLIENT_IP, DEV, ECHO, IPERF, LOADGEN, POD, listening, tcp_echo_once, wait_for, works
from report import cell, med
from subjects import Subject, relay_ports, start_haproxy
from throughput import Iperf

ELK, PEER = "reverse: edgelinkd", "reverse: HAProxy 1 MiB pipes"
# Each reverse subject's forward counterpart, a subject of relay.py.
FORWARD = {ELK: "edgelinkd", PEER: "HAProxy 1 MiB pipes"}
ELK_BASE, PEER_BASE = 19000, 18000
COLUMNS = [  # key, title, format (the forward TCP table's)
    ("gbps1", "TCP 1 stream Gbit/s", "%.2f"),
    ("cpu_per_gb", "relay CPU s/GB (1 stream)", "%.3f"),
    ("conn_s", "connections/s", "%.0f"),
    ("conn_cpu_us", "relay CPU µs/connection", "%.1f"),
]


def ports(base):
    p = relay_ports(base)
    return {IPERF: p[IPERF], ECHO: p[ECHO]}


def entries():
    """The plugin's `reverse` entries for edgelinkd's subject."""
    p = ports(ELK_BASE)
    return [{"name": "r-iperf", "protocol": "tcp", "port": p[IPERF], "target": "%s:%d" % (CLIENT_IP, IPERF)},
            {"name": "r-echo", "protocol": "tcp", "port": p[ECHO], "target": "%s:%d" % (CLIENT_IP, ECHO)}]


def start(procs, tmp, daemon, net1, with_peer, secs):
    """The cluster's iperf3 and TCP echo, and the subjects, each checked end
    to end from the device: (subjects, [(title, measure)])."""
    server = procs.start("iperf3-cluster", CLIENT, ["iperf3", "-s", "-B", CLIENT_IP, "-p", str(IPERF)])
    echo = procs.start("echo-cluster", CLIENT, [LOADGEN, "echo-server", "%s:%d" % (CLIENT_IP, ECHO)])
    for p, port in ((server, IPERF), (echo, ECHO)):
        wait_for("cluster %s on tcp port %d" % (p.name, port), lambda: listening(CLIENT, port), p, procs)
    subjects = [Subject(ELK, net1, ports(ELK_BASE), [daemon], [
        "the same plugin ADD, reverse %s (edgelinkd listens on net1's address, connects from the pod netns)"
        % ", ".join("%s/%d -> %s" % (e["protocol"], e["port"], e["target"]) for e in entries())],
        peer=False, client=DEV)]
    if with_peer:
        peer = start_haproxy(procs, tmp, "haproxy-1m-reverse", PEER_BASE, pipesize=1 << 20, bind=net1,
                             server=CLIENT_IP, services=(IPERF, ECHO), label=PEER)
        peer.client = DEV
        subjects.append(peer)
    for s in subjects:
        owner = s.procs[0]
        for port in (s.ports[IPERF], s.ports[ECHO]):
            wait_for("%s on tcp port %d" % (s.name, port), lambda: listening(POD, port), owner, procs)
        wait_for("%s: a TCP echo through it from the device" % s.name,
                 lambda: works(DEV, tcp_echo_once, s.host, s.ports[ECHO]), owner, procs)
    iperf = Iperf(procs, secs, server, ns=CLIENT, host=CLIENT_IP)
    measures = [("reverse TCP 1 stream", iperf.iperf1), ("reverse short connections", lambda s: conn_rate(s, secs))]
    return subjects, measures


def _ratio(a, b):
    return "%.2f×" % (a / b) if a is not None and b else "–"


def section(subjects, results, secs):
    """The Markdown lines of the reverse table: each subject's forward and
    reverse figures, then the ratios."""
    lines = ["### TCP, reverse: device → pod net1 → cluster", ""]
    w = lines.append
    w("The other way (issue 14): the device calls a service of the cluster (`iperf3 -s` and `elk-loadgen "
      "echo-server` in the client netns, %s) through the pod's net1 address. edgelinkd: reverse forwards "
      "declared in the same plugin ADD (listening on net1's address only, connecting from the pod netns, "
      "through eth0, as the pod). HAProxy 1 MiB pipes: the forward direction's configuration bound to net1's "
      "address, its servers the cluster's. From the device netns, the forward direction's commands "
      "(`iperf3 -t %d`, one stream; `elk-loadgen conn-rate --concurrency 16 --seconds %g`), in every round "
      "after the forward measures, the subjects alternating. The forward rows repeat the TCP table's."
      % (CLIENT_IP, secs["iperf"], secs["short"]))
    w("")
    w("| subject | direction | " + " | ".join(c[1] for c in COLUMNS) + " |")
    w("|---|---|" + "---|" * len(COLUMNS))
    for s in subjects:
        fwd = FORWARD[s.name]
        for direction, name in (("forward: client → pod → device", fwd),
                                ("reverse: device → pod net1 → cluster", s.name)):
            if name in results:
                w("| %s | %s | %s |" % (fwd, direction, " | ".join(
                    cell(f, results[name].get(k, [])) for k, _, f in COLUMNS)))

    def ratios(label, a, b):
        w("| *%s* | | %s |" % (label, " | ".join(
            _ratio(med(results.get(a, {}).get(k, [])), med(results.get(b, {}).get(k, []))) for k, _, _ in COLUMNS)))

    for s in subjects:
        ratios("%s reverse ÷ forward" % FORWARD[s.name], s.name, FORWARD[s.name])
    if any(s.name == PEER for s in subjects):
        ratios("edgelinkd ÷ HAProxy 1 MiB pipes, reverse", ELK, PEER)
        ratios("edgelinkd ÷ HAProxy 1 MiB pipes, forward", FORWARD[ELK], FORWARD[PEER])
    w("")
    return lines
