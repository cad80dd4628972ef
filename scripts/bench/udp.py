"""UDP: elk-loadgen's fixed-rate load against the device's UDP echo;
delivered datagrams, loss (verdict.py checks it at its check load), and
what the relay forwarded, dropped and spent in CPU per datagram."""
from lab import CLIENT, LOADGEN, POD, UDP, run_json
from usage import cpu_seconds, forwarded, snmp

# The UDP loads: key, clients, offered datagrams/s. The first is the issue's
# fixed offered load, where the UDP targets are read.
UDP_LOADS = [("u200", 1, 200000), ("u100", 1, 100000), ("u50", 50, 100000)]


def udp(s, secs, key, clients, rate):
    if not s.ports.get(UDP):
        return {}
    u0, f0, cpu0 = snmp(POD), forwarded(), cpu_seconds(s.pids())
    t = secs["udp"]
    r = run_json(CLIENT, [LOADGEN, "udp", "%s:%d" % (s.host, s.ports[UDP]), "--concurrency", str(clients),
                          "--rate", str(rate), "--size", "1400", "--seconds", str(t)], t + 30)
    u1, f1, cpu1 = snmp(POD), forwarded(), cpu_seconds(s.pids())
    # Per second of sending (the client's own "seconds" also counts the
    # 200 ms it waits for late echoes).
    out = {key + "_pps": r["received"] / t, key + "_loss": r["loss"]}
    if s.is_relay:
        fwd = f1 - f0
        drops = (u1["RcvbufErrors"] - u0["RcvbufErrors"]) + (u1.get("SndbufErrors", 0) - u0.get("SndbufErrors", 0))
        out[key + "_fwd_pps"] = fwd / t
        out[key + "_cpu_us"] = (cpu1 - cpu0) * 1e6 / fwd if fwd else float("nan")
        out[key + "_drops"] = drops / (fwd + drops) if fwd + drops else 0.0
    return out
