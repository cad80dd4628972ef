#!/usr/bin/env python3
"""Write the fuzz targets' seed corpora (fuzz/seeds/<target>/) from what the
tests, manifests and docs already use:

  netconf   network configs: cni-conf/*.json (a conflist's plugins with the
            list's cniVersion and name), the NADs' spec.config (cni-conf/,
            daemonset/), JSON blocks of docs/*.md and README.md, and the
            json!({...}) objects of tests/tests/cni/*.rs and the plugin's
            unit tests that are plain JSON; a few with CNI_ARGS after a NUL
  result    every prevResult found above, every Result-shaped object
            (interfaces/ips/routes) of the tests, and the Result the plugin
            would return for each config with a built-in IPAM range
  record    the attachment record the plugin would write for each config
            with forwards (as commands/add.rs builds it), with its reverse
            forwards and dns when it has them
  control   the request lines the plugin and the tests send (rescan, check,
            reap), replies to check, and the plugin-side field lists
  cni_args  the CNI_ARGS strings of the tests (format arguments filled in)
  handover  edgelinkd's hand-over frames (crates/handover), one of each
            message, an inventory with every kind of descriptor

Run it again after adding tests or examples; it replaces fuzz/seeds/.
Seeds are small (<= 4 KiB) and at most 100 per target; each file is named
by the SHA-1 of its content, as libFuzzer names corpus files.

    scripts/fuzz-seeds.py            # write fuzz/seeds/
    scripts/fuzz-seeds.py --check    # exit 1 if fuzz/seeds/ is out of date
"""

import glob
import hashlib
import json
import os
import re
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEEDS = os.path.join(ROOT, "fuzz", "seeds")
MAX_SEEDS = 100
MAX_BYTES = 4096


def rel(*parts):
    return os.path.join(ROOT, *parts)


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def balanced(text, start):
    """The {...} starting at text[start] ('{'), honouring "strings"."""
    depth, i, in_str = 0, start, False
    while i < len(text):
        c = text[i]
        if in_str:
            if c == "\\":
                i += 1
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return text[start : i + 1]
        i += 1
    return None


def json_objects_in_rust(text):
    """json!({...}) and r#"{...}"# literals that are plain JSON."""
    out = []
    for m in re.finditer(r"json!\(\s*\{", text):
        body = balanced(text, m.end() - 1)
        if body:
            # json! allows trailing commas; JSON does not.
            body = re.sub(r",(\s*[}\]])", r"\1", body)
            try:
                out.append(json.loads(body))
            except ValueError:
                pass
    for m in re.finditer(r'r#"(\{.*?\})"#', text, re.S):
        try:
            out.append(json.loads(m.group(1)))
        except ValueError:
            pass
    return out


def json_blocks_in_markdown(text):
    out = []
    for m in re.finditer(r"```[a-z]*\n(.*?)```", text, re.S):
        try:
            out.append(json.loads(m.group(1)))
        except ValueError:
            pass
    return out


def nad_configs(path):
    """The JSON of every `config: |` block scalar (a NAD's spec.config).
    Read as text, without PyYAML, so that every machine writes the same
    seeds."""
    out = []
    lines = read(path).splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)config: *\|[-+]?\s*$", line)
        if not m:
            continue
        indent, body = len(m.group(1)), []
        for nxt in lines[i + 1 :]:
            if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= indent:
                break
            body.append(nxt)
        try:
            out.append(json.loads("\n".join(body)))
        except ValueError:
            pass
    return out


def walk(v):
    yield v
    if isinstance(v, dict):
        for x in v.values():
            yield from walk(x)
    elif isinstance(v, list):
        for x in v:
            yield from walk(x)


def all_objects():
    objs = []
    for p in sorted(glob.glob(rel("cni-conf", "*.json"))):
        objs.append(json.loads(read(p)))
    for p in sorted(
        glob.glob(rel("cni-conf", "**", "*.yaml"), recursive=True)
        + glob.glob(rel("daemonset", "**", "*.yaml"), recursive=True)
    ):
        objs += nad_configs(p)
    for p in sorted(glob.glob(rel("docs", "*.md")) + [rel("README.md")]):
        objs += json_blocks_in_markdown(read(p))
    for p in sorted(
        glob.glob(rel("tests", "tests", "**", "*.rs"), recursive=True)
        + glob.glob(rel("crates", "edgelink", "src", "**", "*.rs"), recursive=True)
        + glob.glob(rel("crates", "cni-spec", "src", "**", "*.rs"), recursive=True)
    ):
        objs += json_objects_in_rust(read(p))
    return objs


def netconfs(objs):
    out = []
    for o in objs:
        for v in walk(o):
            if not isinstance(v, dict):
                continue
            if isinstance(v.get("plugins"), list):
                for p in v["plugins"]:
                    if isinstance(p, dict):
                        q = {"cniVersion": v.get("cniVersion"), "name": v.get("name")}
                        q.update(p)
                        out.append(q)
            elif v.get("type") == "edgelink" or "forwards" in v:
                out.append(v)
    return out


def results(objs, confs):
    out = []
    for o in objs:
        for v in walk(o):
            if not isinstance(v, dict):
                continue
            if isinstance(v.get("prevResult"), dict):
                out.append(v["prevResult"])
            if any(k in v for k in ("interfaces", "ips", "routes")) and "type" not in v:
                out.append(v)
    # The Result ADD returns for each config with a built-in range.
    for c in confs:
        r = first_range(c)
        if not r:
            continue
        subnet, addr, gw = r
        res = {
            "cniVersion": c.get("cniVersion", "1.1.0"),
            "interfaces": [
                {"name": "edge0", "mac": "02:00:00:00:00:01"},
                {"name": "elk0123456789ab", "mac": "02:00:00:00:00:02"},
                {"name": "net1", "mac": "02:00:00:00:00:03", "sandbox": "/run/netns/pod"},
            ],
            "ips": [{"address": f"{addr}/{subnet.split('/')[1]}", "interface": 2}],
            "dns": {},
        }
        if gw:
            res["ips"][0]["gateway"] = gw
        out.append(res)
    return out


def first_range(c):
    ipam = c.get("ipam")
    if not isinstance(ipam, dict):
        return None
    ranges = ipam.get("ranges")
    if not (isinstance(ranges, list) and ranges and isinstance(ranges[0], list) and ranges[0]):
        return None
    r = ranges[0][0]
    if not isinstance(r, dict) or not isinstance(r.get("subnet"), str):
        return None
    subnet = r["subnet"]
    addr = r.get("rangeStart") or subnet.split("/")[0]
    return subnet, addr, r.get("gateway")


def record_forward(f):
    out = {
        "name": f.get("name"),
        "protocol": str(f.get("protocol", "tcp")).lower(),
        "port": f.get("port"),
        "target": f.get("target"),
        "connectTimeoutMs": f.get("connectTimeoutMs", 5000),
    }
    for k in ("idleTimeoutMs", "maxConnections", "queueTimeoutMs", "connectRetries",
              "proxyProtocol"):
        if f.get(k) is not None:
            out[k] = f[k]
    if f.get("path") == "kernel":
        out["path"] = "kernel"
    return out


def record_reverse(f, subnet):
    out = record_forward(f)
    out.pop("path", None)
    out["allowedSources"] = f.get("allowedSources") or [subnet]
    return out


def records(confs):
    out = []
    for i, c in enumerate(confs):
        fwds = c.get("forwards")
        if not (isinstance(fwds, list) and fwds and all(isinstance(f, dict) for f in fwds)):
            continue
        r = first_range(c)
        subnet = r[0] if r else "172.17.16.0/24"
        addr = r[1] if r else "172.17.16.200"
        stored = {k: v for k, v in c.items() if k != "prevResult"}
        rec = {
            "version": 1,
            "containerId": f"c{i}0123456789abcdef",
            "ifname": "net1",
            "netns": "/var/run/netns/cni-0a1b2c3d",
            "network": c.get("name", "plant-floor"),
            "mode": c.get("mode", "bridge"),
            "podNamespace": "hil",
            "podName": f"proxy-{i}",
            "podUid": "5e1c-0",
            "interface": {
                "name": "net1",
                "mac": "02:00:00:00:00:03",
                "ips": [f"{addr}/{subnet.split('/')[1]}"],
            },
            "forwards": [record_forward(f) for f in fwds],
            "allowedTargets": c.get("allowedTargets") or [subnet],
            "createdAt": 1763950000,
            "cniConfig": stored,
            "pidNamespace": 4026531836,
        }
        rev = c.get("reverse")
        if isinstance(rev, list) and rev and all(isinstance(f, dict) for f in rev):
            rec["reverse"] = [record_reverse(f, subnet) for f in rev]
        dns = (c.get("runtimeConfig") or {}).get("dns") or c.get("dns")
        if isinstance(dns, dict):
            rec["dns"] = dns
        out.append(rec)
    return out


def fill_format(s):
    return re.sub(r"\{[^{}]*\}", "x1", s)


def cni_args_strings():
    out = []
    pat = re.compile(r'"((?:[A-Za-z_0-9]+=[^";]*;)*[A-Za-z_0-9]+=[^";]*)"')
    for p in sorted(glob.glob(rel("tests", "**", "*.rs"), recursive=True)
                    + glob.glob(rel("crates", "cni-spec", "src", "*.rs"))):
        text = read(p).replace("\\\n", "")
        for m in pat.finditer(text):
            s = re.sub(r"\s+", " ", m.group(1))
            if re.search(r"IgnoreUnknown|K8S_|\bIP=|\bMAC=", s):
                out.append(fill_format(s))
    return out


def control_lines():
    lines = [
        "rescan\n",
        "rescan",
        "check c1 net1\n",
        "check 0123456789abcdef0123456789abcdef net1\n",
        "reap 7 net1 /var/run/netns/cni-0a1b2c3d\n",
        "reap 12 eth1 /proc/4242/ns/net\n",
        "reap 3 net1 /run/netns/pod with spaces\n",
        '{"found":true,"forwards":[{"name":"api","listening":true}]}\n',
        '{"found":true,"forwards":[{"name":"api","listening":false,"error":"bind: address in use"},'
        '{"name":"telemetry","listening":true}]}\n',
        '{"found":false,"forwards":[]}\n',
        '{"found":false}\n',
        "ok\n",
        "error: expected `reap <ifindex> <name> <netns>`\n",
        # Plugin side: fields split by NUL (fuzz_targets/control.rs).
        "check\x00c1\x00net1",
        "reap\x007\x00net1\x00/var/run/netns/cni-0a1b2c3d",
    ]
    # The lines the sources themselves write.
    for p in sorted(glob.glob(rel("tests", "**", "*.rs"), recursive=True)):
        for m in re.finditer(r'b"((?:rescan|check|reap)[^"]*)"', read(p)):
            lines.append(m.group(1).encode().decode("unicode_escape"))
    return lines


def handover_frames():
    """Hand-over frame bodies (crates/handover), as both daemons send them:
    the messages of a hand-over of one forward with a listener, a relayed
    connection with bytes in a pipe and a half-closed direction, a waiting
    connection, and a UDP forward with a session."""
    peer = {"protocol": 1, "version": "0.1.0", "instance": "pod-uid-a"}
    state = {
        "instance": "pod-uid-a",
        "control": 0,
        "status": 1,
        "forwards": [
            {
                "containerId": "c1", "ifname": "net1", "name": "api",
                "listeners": [2],
                "connections": [
                    {"client": 3, "upstream": 4,
                     "toTarget": {"pipe": {"read": 5, "write": 6, "len": 4096},
                                  "eof": False, "done": False},
                     "toClient": {"pipe": None, "eof": True, "done": True}},
                    {"client": 7, "upstream": None},
                ],
            },
            {
                "containerId": "c1", "ifname": "net1", "name": "telemetry",
                "udp": [{"listener": 8, "sessions": [
                    {"peer": "10.244.1.20:40000", "local": "10.244.1.10",
                     "socket": 9, "idleMs": 120}]}],
            },
        ],
    }
    msgs = [
        {"type": "hello", **peer},
        {"type": "welcome", **peer},
        {"type": "refused", "reason": "protocol 2, this daemon speaks 1", "code": "protocol"},
        {"type": "refused", "reason": "handed over", "code": "handedOver"},
        {"type": "inventory", "fds": 10, "state": state},
        {"type": "inventory", "fds": 0, "state": {"instance": "x", "control": None,
                                                   "status": None, "forwards": []}},
        {"type": "fds", "count": 253},
        {"type": "confirm"},
        {"type": "abort", "reason": "descriptor #3 is used twice"},
    ]
    return [json.dumps(m) for m in msgs]


def netconf_inputs(confs):
    out = [json.dumps(c, indent=2) for c in confs]
    # CNI_ARGS after a NUL: the keys Config::parse reads.
    for c in confs[:5]:
        body = json.dumps(c)
        out.append(body + "\x00IgnoreUnknown=1;MAC=02:00:00:00:00:aa")
        r = first_range(c)
        if r:
            out.append(body + f"\x00IgnoreUnknown=1;IP={r[1]}")
    return out


# Inputs that once broke a target (docs/reliability.md, Fuzzing), kept as
# seeds so that every run starts from them.
REGRESSIONS = {
    # A float that serde_json's default parsing did not round correctly.
    "netconf": [
        '{"cniVersion": "1.0.0", "name": "n", "type": "edgelink",'
        ' "ipam": {"type": "dhcp", "leaseRatio": 1.0715660391465826e-75}}'
    ],
    "record": [
        '{"version": 1, "containerId": "c1", "ifname": "net1",'
        ' "netns": "/var/run/netns/pod", "network": "n", "mode": "bridge",'
        ' "interface": {"name": "net1", "mac": "02:00:00:00:00:01", "ips": []},'
        ' "createdAt": 1, "cniConfig": {"ipam": {"leaseRatio": 1.0715660391465826e-75}}}'
    ],
}


def unique_small(items):
    seen, out = set(), []
    for s in items:
        b = s if isinstance(s, bytes) else s.encode()
        if len(b) > MAX_BYTES or b in seen:
            continue
        seen.add(b)
        out.append(b)
    return out[:MAX_SEEDS]


def main():
    check = "--check" in sys.argv[1:]
    objs = all_objects()
    confs = netconfs(objs)
    dumps = lambda xs: [json.dumps(x, indent=2) for x in xs]
    targets = {
        "netconf": netconf_inputs(confs),
        "result": dumps(results(objs, confs)),
        "record": dumps(records(confs)),
        "control": control_lines(),
        "cni_args": cni_args_strings(),
        "handover": handover_frames(),
    }
    for t, items in REGRESSIONS.items():
        targets[t] = items + targets[t]
    want = {}
    for t, items in targets.items():
        for b in unique_small(items):
            want[os.path.join(t, hashlib.sha1(b).hexdigest())] = b
    if check:
        have = {}
        for p in glob.glob(os.path.join(SEEDS, "*", "*")):
            with open(p, "rb") as f:
                have[os.path.relpath(p, SEEDS)] = f.read()
        if have != want:
            print("fuzz-seeds: fuzz/seeds/ is out of date: run scripts/fuzz-seeds.py",
                  file=sys.stderr)
            return 1
        return 0
    shutil.rmtree(SEEDS, ignore_errors=True)
    for name, b in want.items():
        os.makedirs(os.path.join(SEEDS, os.path.dirname(name)), exist_ok=True)
        with open(os.path.join(SEEDS, name), "wb") as f:
            f.write(b)
    for t in targets:
        n = len(glob.glob(os.path.join(SEEDS, t, "*")))
        print(f"fuzz-seeds: {t}: {n} seeds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
