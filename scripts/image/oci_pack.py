#!/usr/bin/env python3
"""Pack a root filesystem directory as a one-layer OCI image archive.

    oci_pack.py --rootfs DIR --name edgelink:0.1.0 --entrypoint BIN [--cmd ARG]... --out FILE

The archive is an OCI image layout in a tar file (oci-layout, index.json,
blobs/sha256/...) that `ctr images import` reads. Every entry is owned by
root (0:0) and dated SOURCE_DATE_EPOCH (default 0), entries are sorted, and
the gzip header carries no name or time: the same rootfs gives the same
digests. Modes and symbolic links are kept as they are in DIR.

The manifest is named twice in index.json: `org.opencontainers.image.ref.name`
(the name given) and `io.containerd.image.name` (the same, fully qualified as
the kubelet asks for it: edgelink:0.1.0 -> docker.io/library/edgelink:0.1.0);
ctr uses the second, so the CRI plugin finds the image a manifest names
`image: edgelink:0.1.0`.
"""

import argparse
import gzip
import hashlib
import io
import json
import os
import platform
import stat
import sys
import tarfile
import time

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"

GOARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le", "s390x": "s390x"}


def qualified(name):
    """The reference as containerd's CRI plugin normalizes it."""
    first, _, rest = name.partition("/")
    if not rest:
        return "docker.io/library/" + name
    if "." in first or ":" in first or first == "localhost":
        return name
    return "docker.io/" + name


def layer_tar(rootfs, mtime):
    """The uncompressed layer: every path under rootfs, sorted, root-owned."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        paths = []
        for parent, dirs, files in os.walk(rootfs):
            for n in dirs + files:
                paths.append(os.path.relpath(os.path.join(parent, n), rootfs))
        for rel in sorted(paths):
            full = os.path.join(rootfs, rel)
            st = os.lstat(full)
            info = tarfile.TarInfo(rel)
            info.mode = stat.S_IMODE(st.st_mode)
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = mtime
            if stat.S_ISLNK(st.st_mode):
                info.type = tarfile.SYMTYPE
                info.linkname = os.readlink(full)
                tar.addfile(info)
            elif stat.S_ISDIR(st.st_mode):
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif stat.S_ISREG(st.st_mode):
                info.size = st.st_size
                with open(full, "rb") as f:
                    tar.addfile(info, f)
            else:
                sys.exit(f"oci_pack: {full}: not a file, directory or symlink")
    return buf.getvalue()


def gz(data):
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0) as f:
        f.write(data)
    return buf.getvalue()


def sha256(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rootfs", required=True)
    ap.add_argument("--name", required=True, help="e.g. edgelink:0.1.0")
    ap.add_argument("--entrypoint", required=True)
    ap.add_argument("--cmd", action="append", default=[])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    mtime = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    created = "%04d-%02d-%02dT%02d:%02d:%02dZ" % time.gmtime(mtime)[:6]
    arch = GOARCH.get(platform.machine(), platform.machine())

    layer = layer_tar(args.rootfs, mtime)
    layer_gz = gz(layer)
    config = canonical(
        {
            "created": created,
            "architecture": arch,
            "os": "linux",
            "config": {
                "User": "0",
                "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"],
                "Entrypoint": [args.entrypoint],
                "Cmd": args.cmd,
                "Labels": {
                    "org.opencontainers.image.title": "edgelink",
                    "org.opencontainers.image.description": "edgelink CNI plugin (/opt/edgelink/bin/edgelink) and node daemon edgelinkd",
                    "org.opencontainers.image.licenses": "Apache-2.0",
                },
            },
            "rootfs": {"type": "layers", "diff_ids": [sha256(layer)]},
            "history": [{"created": created, "created_by": "scripts/image-offline.sh"}],
        }
    )
    manifest = canonical(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "digest": sha256(config), "size": len(config)},
            "layers": [{"mediaType": OCI_LAYER, "digest": sha256(layer_gz), "size": len(layer_gz)}],
        }
    )
    index = canonical(
        {
            "schemaVersion": 2,
            "mediaType": OCI_INDEX,
            "manifests": [
                {
                    "mediaType": OCI_MANIFEST,
                    "digest": sha256(manifest),
                    "size": len(manifest),
                    "platform": {"architecture": arch, "os": "linux"},
                    "annotations": {
                        "org.opencontainers.image.ref.name": args.name,
                        "io.containerd.image.name": qualified(args.name),
                    },
                }
            ],
        }
    )

    files = [
        ("oci-layout", canonical({"imageLayoutVersion": "1.0.0"})),
        ("index.json", index),
    ]
    for blob in (config, layer_gz, manifest):
        files.append(("blobs/sha256/" + sha256(blob).split(":", 1)[1], blob))
    with tarfile.open(args.out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, mtime
            tar.addfile(info)
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, mtime
            tar.addfile(info, io.BytesIO(data))
    print(f"oci_pack: {args.name} manifest {sha256(manifest)}")


if __name__ == "__main__":
    main()
