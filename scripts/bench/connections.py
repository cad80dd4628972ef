"""Short connections (connections/s, the relay's CPU per connection, and
failures, which verdict.py checks) and request/reply latency, both with
elk-loadgen from the subject's client netns against the TCP echo behind it
(the device's; the cluster's for the reverse direction)."""
from lab import ECHO, LOADGEN, run_json
from usage import cpu_seconds


def conn_rate(s, secs):
    cpu0 = cpu_seconds(s.pids()) if s.is_relay else 0.0
    r = run_json(s.client, [LOADGEN, "conn-rate", "%s:%d" % (s.host, s.ports[ECHO]), "--concurrency", "16",
                          "--seconds", str(secs["short"])], secs["short"] + 30)
    out = {"conn_s": r["per_second"], "conn_failed": r["failed"], "conn_ok": r["connections"]}
    if s.is_relay and r.get("connections"):
        out["conn_cpu_us"] = (cpu_seconds(s.pids()) - cpu0) * 1e6 / r["connections"]
    return out


def rr(s, secs):
    r = run_json(s.client, [LOADGEN, "rr", "%s:%d" % (s.host, s.ports[ECHO]), "--seconds",
                          str(secs["short"])], secs["short"] + 30)
    return {"p50_us": r["p50_us"], "p99_us": r["p99_us"]}
