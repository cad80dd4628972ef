#!/bin/sh
# Install the edgelink CNI plugin into the host's CNI bin directory and write
# this node's name where the plugin looks for it. The DaemonSet's init
# container runs it, with the host's directories mounted under /host.
#
# The plugin is copied to a temporary file in the target directory, checked
# (it must run here), and renamed over the old one. rename(2) within one
# filesystem is atomic: a runtime never executes a half-written plugin, and
# an ADD or DEL running the old binary keeps its inode (writing over a binary
# that is being executed fails with "text file busy").
#
# Environment (default):
#   SRC          the plugin to install     (/opt/edgelink/bin/edgelink)
#   CNI_BIN_DIR  the host's CNI bin dir     (/host/opt/cni/bin)
#   STATE_DIR    the host's state dir       (/host/var/lib/edgelink)
#   NODE_NAME    written to $STATE_DIR/node-name when set: the plugin's node
#                name for per-node IPAM ranges (docs/configuration.md)
#   UPLINKS, BRIDGES, SHARED_NETWORKS
#                comma-separated names, written to $STATE_DIR/node-policy.json
#                when any of the three is set: the uplinks and existing
#                bridges a NetworkAttachmentDefinition may name on this node,
#                and the network names pods of several namespaces may share
#                (docs/configuration.md, "The node decides"). All unset: the
#                file is left as it is.
set -eu

SRC=${SRC:-/opt/edgelink/bin/edgelink}
CNI_BIN_DIR=${CNI_BIN_DIR:-/host/opt/cni/bin}
STATE_DIR=${STATE_DIR:-/host/var/lib/edgelink}
NODE_NAME=${NODE_NAME:-}

# Everything written here is root's alone, except the plugin (chmod below).
umask 077

log() {
    printf 'install-cni: %s\n' "$*"
}

die() {
    printf 'install-cni: %s\n' "$*" >&2
    exit 1
}

tmp=
cleanup() {
    if [ -n "$tmp" ]; then
        rm -f "$tmp"
    fi
}
trap cleanup EXIT
trap 'exit 1' HUP INT TERM

[ -f "$SRC" ] || die "$SRC: no plugin to install"
[ -d "$CNI_BIN_DIR" ] || die "$CNI_BIN_DIR: not a directory (is the host's CNI bin dir mounted?)"
dst=$CNI_BIN_DIR/edgelink

# Left over by an install that was killed half-way (one pod per node: no
# other install can be running).
rm -f "$CNI_BIN_DIR"/.edgelink.tmp-*

if cmp -s "$SRC" "$dst"; then
    log "$dst is up to date"
else
    tmp=$(mktemp "$CNI_BIN_DIR/.edgelink.tmp-XXXXXX")
    cp "$SRC" "$tmp"
    chmod 0755 "$tmp"
    # On disk before the rename: a crash must not leave an empty plugin.
    sync "$tmp" 2>/dev/null || sync
    # A binary that does not run on this node (architecture, corrupt copy)
    # must not replace one that does.
    CNI_COMMAND=VERSION "$tmp" </dev/null >/dev/null ||
        die "$SRC does not run on this node: $dst left as it was"
    mv -f "$tmp" "$dst"
    tmp=
    log "installed $dst"
fi

if [ -n "$NODE_NAME" ]; then
    [ -d "$STATE_DIR" ] || mkdir -p "$STATE_DIR"
    chmod 0700 "$STATE_DIR"
    printf '%s\n' "$NODE_NAME" >"$STATE_DIR/.node-name.tmp"
    mv -f "$STATE_DIR/.node-name.tmp" "$STATE_DIR/node-name"
    log "node name $NODE_NAME in $STATE_DIR/node-name"
fi

# "a,b" -> ["a", "b"]; names are interface or network names: nothing that
# needs JSON escaping.
json_list() {
    out=''
    IFS_OLD=$IFS
    IFS=,
    for n in $1; do
        [ -n "$n" ] && out="${out:+$out, }\"$n\""
    done
    IFS=$IFS_OLD
    printf '[%s]' "$out"
}

if [ -n "${UPLINKS+x}${BRIDGES+x}${SHARED_NETWORKS+x}" ]; then
    for var in UPLINKS BRIDGES SHARED_NETWORKS; do
        val=''
        eval "val=\${$var:-}"
        case $val in
            *[!A-Za-z0-9_.:,-]*) die "$var=$val: not a comma-separated list of interface or network names" ;;
        esac
    done
    [ -d "$STATE_DIR" ] || mkdir -p "$STATE_DIR"
    chmod 0700 "$STATE_DIR"
    printf '{"uplinks": %s, "bridges": %s, "sharedNetworks": %s}\n' \
        "$(json_list "${UPLINKS:-}" UPLINKS)" "$(json_list "${BRIDGES:-}" BRIDGES)" \
        "$(json_list "${SHARED_NETWORKS:-}" SHARED_NETWORKS)" >"$STATE_DIR/.node-policy.tmp"
    mv -f "$STATE_DIR/.node-policy.tmp" "$STATE_DIR/node-policy.json"
    log "node policy in $STATE_DIR/node-policy.json: $(cat "$STATE_DIR/node-policy.json")"
fi
