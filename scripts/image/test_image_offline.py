"""scripts/image-offline.sh: the archive is a valid one-layer OCI image.

Builds the archive from the static binaries (`make static`) and checks what
`ctr images import` and the DaemonSet rely on: the layout, every digest and
size, the name, the files at the paths daemonset/daemonset.yaml runs with
their modes, /bin/sh and the applets install-cni.sh uses, /var/run -> /run,
binaries without an ELF interpreter, nft (--nft /usr/sbin/nft) with its ELF
interpreter and every library ldd lists, nft running from the unpacked
layer (chroot), and the same digest from a second build.

    python3 -m unittest discover -s scripts/image -p 'test_*.py'   (make test)

EDGELINKD, PLUGIN, OPERATOR, BUSYBOX and NFT name other inputs, as for
scripts/image-offline.sh (any static binary stands in for the first
three). Skipped, with one line saying why, when busybox-static, nftables
or the static binaries are missing; the chroot check alone is skipped when
not root or without chroot(8).
"""

import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import unittest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUSYBOX = os.environ.get("BUSYBOX", "/bin/busybox")
NFT = os.environ.get("NFT", "/usr/sbin/nft")
PT_INTERP = 3


def host_triple():
    out = subprocess.run(["rustc", "-vV"], capture_output=True, text=True, check=True).stdout
    return re.search(r"^host: (\S+)$", out, re.M).group(1)


def version():
    with open(os.path.join(REPO, "Cargo.toml")) as f:
        return re.search(r'^version = "(.*)"$', f.read(), re.M).group(1)


def interp(data):
    """The PT_INTERP path of an ELF64 little-endian image, or None."""
    assert data[:4] == b"\x7fELF", "not an ELF file"
    phoff = int.from_bytes(data[32:40], "little")
    phentsize = int.from_bytes(data[54:56], "little")
    phnum = int.from_bytes(data[56:58], "little")
    for i in range(phnum):
        off = phoff + i * phentsize
        if int.from_bytes(data[off : off + 4], "little") == PT_INTERP:
            p_offset = int.from_bytes(data[off + 8 : off + 16], "little")
            p_filesz = int.from_bytes(data[off + 32 : off + 40], "little")
            return data[p_offset : p_offset + p_filesz].rstrip(b"\0").decode()
    return None


def has_interp(data):
    """Whether an ELF64 little-endian image has a PT_INTERP program header."""
    return interp(data) is not None


def ldd(path):
    """The files `ldd path` says the program loads (interpreter included)."""
    out = subprocess.run(["ldd", path], capture_output=True, text=True, check=True).stdout
    return sorted(set(re.findall(r"^\s*(?:\S+ => )?(/\S+) \(0x", out, re.M)))


def sha256(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def why_skip():
    if not os.path.isfile(BUSYBOX):
        return f"{BUSYBOX} missing (apt-get install busybox-static, or scripts/install-deps.sh test)"
    with open(BUSYBOX, "rb") as f:
        if has_interp(f.read()):
            return f"{BUSYBOX} is not static (Debian's busybox-static provides a static one)"
    if not os.access(NFT, os.X_OK):
        return f"{NFT} missing (apt-get install nftables, or scripts/install-deps.sh test)"
    if shutil.which("ldd") is None:
        return "ldd missing (libc-bin)"
    for path, make in BINARIES:
        if not os.path.isfile(path):
            return f"{path} missing ({make})"
    return None


def _binaries():
    rel = os.path.join(REPO, "target", host_triple(), "release")
    op = os.path.join(REPO, "target", host_triple(), "operator", "edgelink-operator")
    return [
        (os.environ.get("EDGELINKD", os.path.join(rel, "edgelinkd")), "make static"),
        (os.environ.get("PLUGIN", os.path.join(rel, "edgelink")), "make static"),
        (os.environ.get("OPERATOR", op), "make static-operator"),
    ]


BINARIES = _binaries()


SKIP = why_skip()
if SKIP is not None:
    print(f"offline image: skipped: {SKIP}", file=sys.stderr)


@unittest.skipIf(SKIP is not None, f"offline image: skipped: {SKIP}")
class OfflineImage(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(dir=os.path.join(REPO, "target"))
        cls.archives = []
        for n in range(2):
            out = os.path.join(cls.tmp.name, f"image{n}.oci.tar")
            subprocess.run(
                [os.path.join(REPO, "scripts", "image-offline.sh"), out],
                check=True,
                capture_output=True,
            )
            cls.archives.append(out)
        with tarfile.open(cls.archives[0]) as t:
            cls.files = {m.name: t.extractfile(m).read() for m in t.getmembers() if m.isfile()}

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def blob(self, desc):
        """The blob a descriptor names, its digest and size checked."""
        digest = desc["digest"]
        data = self.files["blobs/sha256/" + digest.split(":", 1)[1]]
        self.assertEqual(sha256(data), digest)
        self.assertEqual(len(data), desc["size"], digest)
        return data

    def manifest(self):
        index = json.loads(self.files["index.json"])
        self.assertEqual(index["schemaVersion"], 2)
        (desc,) = index["manifests"]
        self.assertEqual(desc["mediaType"], "application/vnd.oci.image.manifest.v1+json")
        return desc, json.loads(self.blob(desc))

    def layer(self):
        _, m = self.manifest()
        (desc,) = m["layers"]
        self.assertEqual(desc["mediaType"], "application/vnd.oci.image.layer.v1.tar+gzip")
        return gzip.decompress(self.blob(desc))

    def test_layout_name_and_digests(self):
        self.assertEqual(json.loads(self.files["oci-layout"]), {"imageLayoutVersion": "1.0.0"})
        desc, m = self.manifest()
        self.assertEqual(desc["annotations"]["org.opencontainers.image.ref.name"], f"edgelink:{version()}")
        self.assertEqual(desc["annotations"]["io.containerd.image.name"], f"docker.io/library/edgelink:{version()}")
        config = json.loads(self.blob(m["config"]))
        self.assertEqual(config["os"], "linux")
        self.assertEqual(config["rootfs"]["diff_ids"], [sha256(self.layer())])
        self.assertEqual(config["config"]["Entrypoint"], ["/usr/local/bin/edgelinkd"])
        # Nothing but the manifest's blobs.
        blobs = {n for n in self.files if n.startswith("blobs/")}
        self.assertEqual(len(blobs), 3)

    def test_layer_has_what_the_daemonset_runs(self):
        with tarfile.open(fileobj=io.BytesIO(self.layer())) as t:
            members = {m.name: m for m in t.getmembers()}
            for path in (
                "usr/local/bin/edgelinkd",
                "usr/local/bin/edgelink-operator",
                "opt/edgelink/bin/edgelink",
                "usr/local/bin/install-cni.sh",
                "bin/busybox",
            ):
                m = members.get(path)
                self.assertIsNotNone(m, path)
                self.assertTrue(m.isfile(), path)
                self.assertEqual(m.mode, 0o755, path)
                self.assertEqual((m.uid, m.gid), (0, 0), path)
                if path != "usr/local/bin/install-cni.sh":
                    self.assertFalse(has_interp(t.extractfile(m).read()), f"{path} is dynamically linked")
            with open(os.path.join(REPO, "daemonset", "install-cni.sh"), "rb") as f:
                self.assertEqual(t.extractfile(members["usr/local/bin/install-cni.sh"]).read(), f.read())
            var_run = members["var/run"]
            self.assertTrue(var_run.issym())
            self.assertEqual(var_run.linkname, "/run")
            self.assertTrue(members["run"].isdir())
            # The shell and every command install-cni.sh runs that is not
            # one of ash's built-ins.
            for applet in ("sh", "cat", "chmod", "cmp", "cp", "mkdir", "mktemp", "mv", "rm", "sync"):
                m = members.get("bin/" + applet)
                self.assertIsNotNone(m, applet)
                self.assertTrue(m.issym() and m.linkname == "busybox", applet)
            self.assertTrue(all(m.mtime == 0 for m in members.values()))

    def test_the_daemonset_and_the_operator_name_this_image(self):
        for part in ("daemonset.yaml", "operator/operator.yaml"):
            with open(os.path.join(REPO, "daemonset", part)) as f:
                images = re.findall(r"^\s+image: (\S+)$", f.read(), re.M)
            self.assertEqual(set(images), {f"edgelink:{version()}"}, part)

    def test_layer_has_nft_and_exactly_what_it_loads(self):
        """--nft /usr/sbin/nft (daemonset.yaml): the host's nft, its ELF
        interpreter and each library ldd lists, at the path ldd gives, with
        the host's bytes; and no other shared object in the image."""
        with tarfile.open(fileobj=io.BytesIO(self.layer())) as t:
            members = {m.name: m for m in t.getmembers()}
            nft = members.get("usr/sbin/nft")
            self.assertIsNotNone(nft, "usr/sbin/nft")
            self.assertTrue(nft.isfile())
            self.assertEqual(nft.mode, 0o755)
            with open(NFT, "rb") as f:
                self.assertEqual(t.extractfile(nft).read(), f.read())
            loader = interp(t.extractfile(nft).read())
            self.assertIsNotNone(loader, "nft has no ELF interpreter")
            wanted = ldd(NFT)
            self.assertIn(loader, wanted)
            for soname in ("libnftables.so.1", "libc.so.6"):
                self.assertTrue(any(p.endswith("/" + soname) for p in wanted), f"ldd lists no {soname}")
            for path in wanted:
                m = members.get(path.lstrip("/"))
                self.assertIsNotNone(m, f"{path}: nft loads it, the image lacks it")
                self.assertTrue(m.isfile(), f"{path}: a regular file, links resolved")
                self.assertEqual(m.mode, 0o755 if path == loader else 0o644, path)
                with open(path, "rb") as f:
                    self.assertEqual(t.extractfile(m).read(), f.read(), path)
            shared = {
                "/" + n for n, m in members.items() if m.isfile() and re.search(r"\.so(\.\d+)*$", n)
            }
            self.assertEqual(shared, set(wanted), "shared objects nft does not load")

    def test_nft_runs_from_the_unpacked_layer(self):
        """nft starts with only the image's files (chroot), and talks to the
        kernel: `nft -j list ruleset` in a network namespace of its own."""
        if os.geteuid() != 0:
            self.skipTest("chroot needs root")
        for tool in ("chroot", "tar", "unshare"):
            if shutil.which(tool) is None:
                self.skipTest(f"{tool} missing")
        with tempfile.TemporaryDirectory(dir=self.tmp.name) as d:
            layer = os.path.join(d, "layer.tar")
            with open(layer, "wb") as f:
                f.write(self.layer())
            root = os.path.join(d, "rootfs")
            os.mkdir(root)
            subprocess.run(["tar", "-xf", layer, "-C", root], check=True)
            out = subprocess.run(
                ["chroot", root, "/usr/sbin/nft", "--version"], capture_output=True, text=True
            )
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertTrue(out.stdout.startswith("nftables v"), out.stdout)
            out = subprocess.run(
                ["unshare", "--net", "chroot", root, "/usr/sbin/nft", "-j", "list", "ruleset"],
                capture_output=True,
                text=True,
            )
            if out.returncode != 0 and "unshare" in out.stderr:
                self.skipTest(f"no network namespace for the nft check: {out.stderr.strip()}")
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertIn('"nftables"', out.stdout)

    def test_same_inputs_same_digest(self):
        with open(self.archives[0], "rb") as a, open(self.archives[1], "rb") as b:
            self.assertEqual(a.read(), b.read())


if __name__ == "__main__":
    unittest.main()
