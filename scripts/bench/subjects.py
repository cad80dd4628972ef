"""The subjects: the ways from the client to the device services that are
compared. "direct" (routed, no relay), edgelinkd and edgelinkd's kernel
path are made by relay.py's bring_up (edgelinkd's by the lab's plugin
ADDs); the peers socat, HAProxy and nginx are started here, in the pod
netns.
"""
import os

import lab
from lab import CLIENT, CLOSE, DEV_IP, ECHO, IDLE, IPERF, NGINX_STREAM, POD, POD_IP, UDP, listening, wait_for, works
from lab import tcp_echo_once, udp_echo_once


class Subject:
    """A way from the client to the device services: host and ports
    {IPERF: p, ECHO: p, UDP: p or None, IDLE: p}, the processes whose CPU and
    memory are the relay's, and the exact commands it was run with.
    `client` is the netns the load runs from (the device's for the
    reverse direction, reverse.py)."""

    def __init__(self, name, host, ports, procs=(), commands=(), peer=True, client=CLIENT):
        self.name, self.host, self.ports = name, host, ports
        self.procs, self.commands, self.peer = list(procs), list(commands), peer
        self.client = client

    def pids(self):
        return [p.pid for p in self.procs]

    @property
    def is_relay(self):
        return bool(self.procs)


def relay_ports(base):
    return {IPERF: base + 201, ECHO: base, UDP: base + 1, IDLE: base + 2}


def start_socat(procs):
    ports = relay_ports(11000)
    ps, cmds = [], []
    for svc in (IPERF, ECHO, IDLE):
        argv = ["socat", "TCP4-LISTEN:%d,bind=%s,fork,reuseaddr" % (ports[svc], POD_IP),
                "TCP4:%s:%d" % (DEV_IP, svc)]
        ps.append(procs.start("socat-%d" % ports[svc], POD, argv))
        cmds.append(" ".join(argv))
    argv = ["socat", "UDP4-RECVFROM:%d,bind=%s,fork" % (ports[UDP], POD_IP), "UDP4-SENDTO:%s:%d" % (DEV_IP, UDP)]
    ps.append(procs.start("socat-%d" % ports[UDP], POD, argv))
    cmds.append(" ".join(argv))
    return Subject("socat", POD_IP, ports, ps, cmds)


def start_haproxy(procs, tmp, name, base, pipesize=None, bind=POD_IP, server=DEV_IP, services=(IPERF, ECHO, IDLE),
                  label=None):
    """HAProxy in the pod netns, on `bind`, to `server` (the device; the
    cluster service for the reverse direction), one listen per service."""
    ports = relay_ports(base)
    ports[UDP] = None  # HAProxy has no UDP proxy
    # HAProxy wants 2 descriptors per connection and 2 per pipe (by default
    # maxconn/4 pipes) below RLIMIT_NOFILE; where that is capped (no
    # CAP_SYS_RESOURCE), fewer pipes: more than 512 never splice at once here.
    maxconn = min(20000, (lab.FD_LIMIT - 1600) // 2)
    cfg = ["global", "    maxconn %d" % maxconn]
    if lab.FD_LIMIT < 60000:
        cfg.append("    maxpipes 512")
    if pipesize:
        cfg.append("    tune.pipesize %d" % pipesize)
    cfg += ["defaults", "    mode tcp", "    maxconn %d" % maxconn, "    timeout connect 5s",
            "    timeout client 10m", "    timeout server 10m",
            "    option splice-request", "    option splice-response"]
    for svc in services:
        cfg += ["listen p%d" % ports[svc], "    bind %s:%d" % (bind, ports[svc]),
                "    server dev %s:%d" % (server, svc)]
    path = os.path.join(tmp, name + ".cfg")
    with open(path, "w") as f:
        f.write("\n".join(cfg) + "\n")
    p = procs.start(name, POD, ["haproxy", "-f", path, "-db"])
    label = label or "HAProxy" + (" %d MiB pipes" % (pipesize >> 20) if pipesize else "")
    shown = [l.strip() for l in cfg[:cfg.index("listen p%d" % ports[IPERF]) + 3]]
    return Subject(label, bind, ports, [p],
                   ["haproxy -f %s.cfg -db  # %s; (one listen section per port)" % (name, "; ".join(shown))])


def start_nginx(procs, tmp):
    ports = relay_ports(14000)
    d = os.path.join(tmp, "nginx")
    os.makedirs(d)
    conf = ["load_module %s;" % NGINX_STREAM, "worker_processes auto;", "worker_rlimit_nofile %d;" % lab.FD_LIMIT,
            "events { worker_connections %d; }" % (lab.FD_LIMIT - 200), "stream {"]
    for svc in (IPERF, ECHO, IDLE):
        conf.append("    server { listen %s:%d; proxy_pass %s:%d; }" % (POD_IP, ports[svc], DEV_IP, svc))
    conf.append("    server { listen %s:%d udp; proxy_pass %s:%d; }" % (POD_IP, ports[UDP], DEV_IP, UDP))
    conf.append("}")
    path = os.path.join(d, "nginx.conf")
    with open(path, "w") as f:
        f.write("\n".join(conf) + "\n")
    argv = ["nginx", "-p", d, "-c", path, "-e", "stderr",
            "-g", "daemon off; pid %s/nginx.pid; error_log stderr;" % d]
    p = procs.start("nginx", POD, argv)
    return Subject("nginx", POD_IP, ports, [p],
                   ["nginx -p DIR -c nginx.conf -g 'daemon off; ...'  # worker_processes auto; "
                    "server { listen %s:%d; proxy_pass %s:%d; } per port (udp for UDP)"
                    % (POD_IP, ports[ECHO], DEV_IP, ECHO)])


def edgelink_forwards():
    """edgelinkd's forwards: the four services every subject has, and the
    closing echo (sustained.py), which the peers do not serve."""
    ports = relay_ports(15000)
    ports[CLOSE] = 15010
    fw = [{"name": "iperf", "protocol": "tcp", "port": ports[IPERF], "target": "%s:%d" % (DEV_IP, IPERF)},
          {"name": "echo", "protocol": "tcp", "port": ports[ECHO], "target": "%s:%d" % (DEV_IP, ECHO)},
          {"name": "udp", "protocol": "udp", "port": ports[UDP], "target": "%s:%d" % (DEV_IP, UDP)},
          {"name": "idle", "protocol": "tcp", "port": ports[IDLE], "target": "%s:%d" % (DEV_IP, IDLE)},
          {"name": "close", "protocol": "tcp", "port": ports[CLOSE], "target": "%s:%d" % (DEV_IP, CLOSE)}]
    return ports, fw


KERNEL = "edgelinkd kernel path"


def kernel_forwards():
    """The same forwards as edgelink_forwards(), on their own ports, with
    `"path": "kernel"`: nftables DNAT in the kernel path's pod, no relay
    process."""
    ports = relay_ports(17000)
    ports[CLOSE] = 17010
    fw = [{"name": "k-" + f["name"], "protocol": f["protocol"], "port": ports[svc], "target": f["target"],
           "path": "kernel"} for svc, f in zip((IPERF, ECHO, UDP, IDLE, CLOSE), edgelink_forwards()[1])]
    return ports, fw


def wait_subject(s, procs):
    for svc, port in s.ports.items():
        if port is None or not s.is_relay:
            continue
        proto = "udp" if svc == UDP else "tcp"
        owner = s.procs[0] if s.procs else None
        wait_for("%s on %s port %d" % (s.name, proto, port),
                 lambda: listening(POD, port, proto), owner, procs)
    owner = s.procs[0] if s.procs else None
    wait_for("%s: a TCP echo through it" % s.name,
             lambda: works(CLIENT, tcp_echo_once, s.host, s.ports[ECHO]), owner, procs)
    if s.ports[UDP]:
        wait_for("%s: a UDP echo through it" % s.name,
                 lambda: works(CLIENT, udp_echo_once, s.host, s.ports[UDP]), owner, procs)
