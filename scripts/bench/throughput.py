"""TCP throughput: iperf3 through each subject, and the relay's CPU per GB."""
import subprocess
import time

from lab import DEV, DEV_IP, IPERF, listening, run_json, wait_for
from usage import cpu_seconds


class Iperf:
    """iperf3 from the subject's client netns against the iperf3 server
    behind it (the device's, in `ns` at `host`; the cluster's for the
    reverse direction), which is restarted when a run through a subject
    fails."""

    def __init__(self, procs, secs, server, ns=DEV, host=DEV_IP):
        self.procs, self.secs, self.iperf_server = procs, secs, server
        self.ns, self.host = ns, host

    def restart_iperf(self):
        name = self.iperf_server.name
        self.procs.stop(self.iperf_server)
        self.procs.started.remove(self.iperf_server)
        self.iperf_server = self.procs.start(name, self.ns, ["iperf3", "-s", "-B", self.host, "-p", str(IPERF)])
        wait_for(name, lambda: listening(self.ns, IPERF), self.iperf_server, self.procs)

    def iperf(self, s, streams):
        argv = ["iperf3", "-J", "-c", s.host, "-p", str(s.ports[IPERF]), "-t", str(self.secs["iperf"]),
                "-P", str(streams), "--connect-timeout", "3000"]
        for attempt in (1, 2):
            cpu0 = cpu_seconds(s.pids())
            try:
                r = run_json(s.client, argv, self.secs["iperf"] + 30)
                if "error" in r:
                    raise RuntimeError(r["error"])
                end = r["end"]["sum_received"]
                time.sleep(0.2)  # let socat's children exit and be reaped
                cpu = cpu_seconds(s.pids()) - cpu0
                gb = end["bytes"] / 1e9
                out = {"gbps": end["bits_per_second"] / 1e9}
                if s.is_relay and streams == 1:
                    out["cpu_per_gb"] = cpu / gb if gb else float("nan")
                return out
            except (RuntimeError, subprocess.TimeoutExpired, KeyError) as e:
                if attempt == 2:
                    raise RuntimeError("iperf3 through %s failed twice: %s" % (s.name, e))
                print("  (iperf3 through %s failed: %s; restarting the iperf3 server and retrying)"
                      % (s.name, str(e)[:200]), flush=True)
                self.restart_iperf()

    def iperf1(self, s):
        r = self.iperf(s, 1)
        r["gbps1"] = r.pop("gbps")
        return r
