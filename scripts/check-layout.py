#!/usr/bin/env python3
"""The map stays readable (docs/architecture.md, "The map"); run by `make lint`.

- No two modules of a crate import each other, directly or in a circle
  (`crate::a` in b.rs and `crate::b` in a.rs); comments and test modules
  do not count.
- A library never depends on a package that builds a binary (edgelink,
  edgelinkd, edgelink-operator, elk-loadgen): binaries are thin processes
  over libraries, never the other way round.
- In the node daemon's crates (DAEMON below), a source file has at most
  600 lines and a function at most 80, unless the comment above it says
  why (a line with "long:"). The other crates join this list as they are
  cleaned up (the plugin's `add` is 188 lines today).

Exit 1 naming every breach.
"""

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DAEMON = ["edgelinkd", "node", "forward", "status", "fd-reserve", "handover"]
BINARIES = {"edgelink", "edgelinkd", "edgelink-operator", "elk-loadgen"}
MAX_FILE, MAX_FN = 600, 80

TEST_MOD = re.compile(r"#\[cfg\(test\)\]\s*(pub(\(crate\))?\s+)?mod \w+\s*(;|\{)")
FN = re.compile(r"^(\s*)(pub(\([a-z:]+\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?fn (\w+)")


def sources(src):
    for dp, _, fs in os.walk(src):
        for f in sorted(fs):
            if f.endswith(".rs"):
                yield os.path.join(dp, f)


def module(src, path):
    parts = os.path.relpath(path, src)[:-3].split(os.sep)
    if parts[-1] == "mod":
        parts = parts[:-1]
    if parts in (["lib"], ["main"]):
        return ""
    return "::".join(parts)


def code(path):
    """The file's text without its test module and comment lines."""
    text = open(path, encoding="utf-8").read()
    m = TEST_MOD.search(text)
    if m:
        text = text[: m.start()]
    return "\n".join(l for l in text.split("\n") if not l.lstrip().startswith("//"))


def cycles(crate, src):
    mods = {module(src, p): code(p) for p in sources(src)}
    edges = {m: set() for m in mods}
    for m, text in mods.items():
        refs = re.findall(r"crate::([a-z_][a-z0-9_]*(?:::[a-z_][a-z0-9_]*)*)", text)
        parent = "::".join(m.split("::")[:-1])
        refs += [
            (parent + "::" + r if parent else r) for r in re.findall(r"super::([a-z_][a-z0-9_]*)", text)
        ]
        for ref in refs:
            parts = ref.split("::")
            for k in range(len(parts), 0, -1):
                target = "::".join(parts[:k])
                if target in mods:
                    related = target == m or m.startswith(target + "::") or target.startswith(m + "::")
                    if not related and target != "":
                        edges[m].add(target)
                    break
    # Tarjan's strongly connected components.
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(mods):
        if v not in index:
            visit(v)
    return ["%s: modules import each other: %s" % (crate, " <-> ".join(c)) for c in out]


def long_functions(path):
    text = open(path, encoding="utf-8").read()
    m = TEST_MOD.search(text)
    lines = (text[: m.start()] if m else text).split("\n")
    out = []
    for i, line in enumerate(lines):
        f = FN.match(line)
        if not f or line.rstrip().endswith(";"):
            continue
        indent = f.group(1)
        j = i + 1
        while j < len(lines) and lines[j].rstrip() != indent + "}":
            j += 1
        length = j - i + 1
        if length <= MAX_FN:
            continue
        k = i - 1
        said = False
        while k >= 0 and lines[k].lstrip().startswith(("//", "#[")):
            said |= "long:" in lines[k]
            k -= 1
        if not said:
            out.append("%s:%d: fn %s is %d lines (at most %d, or say why with 'long:')"
                       % (os.path.relpath(path, ROOT), i + 1, f.group(7), length, MAX_FN))
    return out


def dependencies(manifest):
    deps, section = [], None
    for line in open(manifest, encoding="utf-8"):
        s = line.strip()
        if s.startswith("["):
            section = s
            continue
        if section == "[dependencies]" and "=" in s and not s.startswith("#"):
            deps.append(s.split("=")[0].strip())
    return deps


def main():
    problems = []
    crates = os.path.join(ROOT, "crates")
    for crate in sorted(os.listdir(crates)):
        src = os.path.join(crates, crate, "src")
        if not os.path.isdir(src):
            continue
        problems += cycles(crate, src)
        for d in dependencies(os.path.join(crates, crate, "Cargo.toml")):
            if d in BINARIES:
                problems.append("crates/%s depends on the binary package %s" % (crate, d))
        if crate in DAEMON:
            for p in sources(src):
                if os.path.basename(p) == "tests.rs" or os.sep + "tests" + os.sep in p:
                    continue
                n = sum(1 for _ in open(p, encoding="utf-8"))
                if n > MAX_FILE:
                    problems.append("%s is %d lines (at most %d)" % (os.path.relpath(p, ROOT), n, MAX_FILE))
                problems += long_functions(p)
    for p in problems:
        print("check-layout: " + p)
    if problems:
        return 1
    print("check-layout: no module circles, no library on a binary; the daemon's crates: "
          "files <= %d lines, functions <= %d" % (MAX_FILE, MAX_FN))
    return 0


if __name__ == "__main__":
    sys.exit(main())
