#!/usr/bin/env bash
# Build the DaemonSet's (and edgelink-operator's) image without a registry, a base image or a container
# builder: a root filesystem with the static edgelinkd and plugin,
# install-cni.sh, busybox (its /bin/sh) and the build machine's nft with
# the shared libraries it loads (the kernel path runs it), packed as an OCI
# image archive (oci-layout, index.json, manifest, config, one gzip layer)
# named edgelink:<version>.
#
#   scripts/image-offline.sh [OUT]      (make image-offline)
#
# Then, on each edge node (containerd):
#
#   ctr -n k8s.io images import OUT
#
# Environment (default):
#   EDGELINKD  static edgelinkd    (target/<host>/release/edgelinkd)
#   PLUGIN     static plugin       (target/<host>/release/edgelink)
#   OPERATOR   static edgelink-operator (target/<host>/operator/edgelink-operator)
#   BUSYBOX    a static busybox    (/bin/busybox, Debian's busybox-static)
#   NFT        nft, dynamic        (/usr/sbin/nft, Debian's nftables)
#   VERSION    the image's tag     (the workspace version in Cargo.toml)
#   OUT        the archive         (target/image/edgelink-<version>.oci.tar)
#
# `make image-offline` builds the binaries first (`make static
# static-operator`) and installs nftables (scripts/install-deps.sh test).
# Every binary but nft must be statically linked (no ELF interpreter). nft
# is copied to /usr/sbin/nft with exactly what `ldd` says it loads: its ELF
# interpreter and shared libraries, each at the path ldd prints (e.g.
# /lib64/ld-linux-x86-64.so.2, /lib/x86_64-linux-gnu/libc.so.6), symbolic
# links resolved; the image has no other libc, and nothing else uses this
# one. The archive depends only on its inputs (fixed timestamps and
# owners), so the same binaries and the same nftables and glibc packages
# give the same image digest.
set -euo pipefail
cd "$(dirname "$0")/.."

die() {
    echo "image-offline: $*" >&2
    exit 1
}

host=$(rustc -vV | sed -n 's/^host: //p')
VERSION=${VERSION:-$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)}
EDGELINKD=${EDGELINKD:-target/$host/release/edgelinkd}
PLUGIN=${PLUGIN:-target/$host/release/edgelink}
OPERATOR=${OPERATOR:-target/$host/operator/edgelink-operator}
BUSYBOX=${BUSYBOX:-/bin/busybox}
NFT=${NFT:-/usr/sbin/nft}
OUT=${1:-${OUT:-target/image/edgelink-$VERSION.oci.tar}}
readonly IMAGE_NAME=edgelink:$VERSION

# The applets install-cni.sh runs (besides the shell's built-ins), and a
# few to look around with `kubectl exec ... -- ls /run/netns`.
readonly APPLETS=(sh cat chmod cmp cp echo env ls mkdir mktemp mv printf readlink rm sleep sync test '[')

[[ -n $VERSION ]] || die "no version in Cargo.toml"
command -v readelf >/dev/null || die "readelf not found (binutils)"
for bin in "$EDGELINKD" "$PLUGIN" "$OPERATOR" "$BUSYBOX"; do
    [[ -f $bin ]] || die "$bin: not found (make release; apt-get install busybox-static)"
    if readelf -lW "$bin" | grep -q 'Requesting program interpreter'; then
        die "$bin is dynamically linked: the image has no libc (make release builds both static)"
    fi
done
[[ -x $NFT ]] || die "$NFT: not found (apt-get install nftables, or scripts/install-deps.sh test): the kernel path runs it"
command -v ldd >/dev/null || die "ldd not found (libc-bin)"

# What nft loads: the ELF interpreter and every shared library, as absolute
# paths (ldd's "name => /path (addr)" and "/path (addr)" lines; the vDSO
# has no file). A library ldd cannot find stops the build.
nft_ldd=$(ldd "$NFT") || die "ldd $NFT failed"
NFT_LIBS=()
while read -r line; do
    case $line in
    *"not found"*) die "$NFT needs a library this machine lacks: $line" ;;
    *" => /"*) line=${line#*=> } && NFT_LIBS+=("${line%% (*}") ;;
    /*) NFT_LIBS+=("${line%% (*}") ;;
    esac
done <<<"$nft_ldd"
[[ ${#NFT_LIBS[@]} -gt 0 ]] || die "ldd $NFT lists no library: not the dynamic nft this image expects"

out_dir=$(dirname "$OUT")
mkdir -p "$out_dir"
work=$(mktemp -d "$out_dir/.image-offline.XXXXXX")
cleanup() {
    rm -rf "$work"
}
trap cleanup EXIT

root=$work/rootfs
# Directories that install -D makes get 0777 & ~umask: the same modes
# whatever the caller's umask.
umask 022
install -d -m 0755 "$root"/{bin,dev,etc,opt/edgelink/bin,proc,run,sys,usr/local/bin,var}
install -d -m 1777 "$root/tmp"
install -m 0755 "$EDGELINKD" "$root/usr/local/bin/edgelinkd"
install -m 0755 "$PLUGIN" "$root/opt/edgelink/bin/edgelink"
install -m 0755 "$OPERATOR" "$root/usr/local/bin/edgelink-operator"
install -m 0755 daemonset/install-cni.sh "$root/usr/local/bin/install-cni.sh"
install -m 0755 "$BUSYBOX" "$root/bin/busybox"
# nft for the kernel path (daemonset.yaml: --nft /usr/sbin/nft). The ELF
# interpreter must be executable; the libraries are mapped, not run.
install -D -m 0755 "$NFT" "$root/usr/sbin/nft"
interp=$(readelf -lW "$NFT" | sed -n 's/.*Requesting program interpreter: \(.*\)]$/\1/p')
[[ -n $interp ]] || die "$NFT has no ELF interpreter: expected Debian's dynamic nft"
for lib in "${NFT_LIBS[@]}"; do
    mode=0644
    if [[ $lib == "$interp" ]]; then
        mode=0755
    fi
    install -D -m "$mode" "$lib" "$root$lib"
done
[[ -f $root$interp ]] || die "ldd $NFT did not list its interpreter $interp"
for applet in "${APPLETS[@]}"; do
    ln -s busybox "$root/bin/$applet"
done
# Records name netns files /var/run/netns/... or /run/netns/...; the
# DaemonSet mounts the host's /run/netns: both must lead to it.
ln -s /run "$root/var/run"
printf 'root:x:0:0:root:/:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\n' >"$root/etc/group"
# Name lookups (only --status-webhook makes any): the static glibc has the
# files and dns sources built in and needs no shared library for them.
printf 'hosts: files dns\n' >"$root/etc/nsswitch.conf"
chmod 0644 "$root/etc/passwd" "$root/etc/group" "$root/etc/nsswitch.conf"

python3 scripts/image/oci_pack.py --rootfs "$root" --name "$IMAGE_NAME" \
    --entrypoint /usr/local/bin/edgelinkd --cmd run --out "$work/archive.tar"
mv -f "$work/archive.tar" "$OUT"
echo "image-offline: wrote $OUT ($IMAGE_NAME, $(du -h "$OUT" | cut -f1))"
echo "image-offline: import on a node with: ctr -n k8s.io images import $OUT"
