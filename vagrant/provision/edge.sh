#!/usr/bin/env bash
# kedge1: its second NIC, cabled to the private segment, is the uplink the
# edgelink NetworkAttachmentDefinitions name (UPLINK, eth1). It stays without
# an address (the bridge of a bridge-mode NAD enslaves it; an uplink with
# addresses is refused) but must be up at every boot.
#
# The NIC is found, whatever the box calls it, as the one physical NIC that
# is neither the management NIC (default route) nor the cluster NIC (NODE_IP).
# If it is not called UPLINK yet (a box with predictable names, ens6 say), a
# systemd .link file matching its MAC renames it, now and at every boot.
#
# Env: UPLINK, NODE_IP. Runs as root; safe to run again.
set -euo pipefail
: "${UPLINK:?}" "${NODE_IP:?}"

say() { echo "edge: $*"; }
die() {
    echo "edge: $*" >&2
    exit 1
}

mgmt=$(ip -4 route show default | awk '{for (i = 1; i < NF; i++) if ($i == "dev") {print $(i + 1); exit}}')
cluster=$(ip -o -4 addr show | awk -v ip="$NODE_IP" 'index($4, ip "/") == 1 {print $2; exit}')
[[ -n $cluster ]] || die "no NIC holds the node address $NODE_IP"

candidates=()
for path in /sys/class/net/*; do
    nic=${path##*/}
    [[ -e $path/device ]] || continue # virtual: lo, bridges, veths, vxlan
    [[ $nic != "$mgmt" && $nic != "$cluster" ]] || continue
    candidates+=("$nic")
done
[[ ${#candidates[@]} == 1 ]] ||
    die "expected one NIC besides $mgmt (management) and $cluster (cluster), found: ${candidates[*]:-none}"
nic=${candidates[0]}

if [[ $nic != "$UPLINK" ]]; then
    [[ ! -e /sys/class/net/$UPLINK ]] || die "$UPLINK exists but is not the segment NIC ($nic is)"
    mac=$(cat "/sys/class/net/$nic/address")
    say "renaming $nic ($mac) to $UPLINK"
    install -d -m 0755 /etc/systemd/network
    cat > /etc/systemd/network/10-edgelink-uplink.link <<EOF
# edgelink lab: kedge1's NIC on the private segment (vagrant/provision/edge.sh)
[Match]
MACAddress=$mac

[Link]
Name=$UPLINK
EOF
    ip link set dev "$nic" down
    ip link set dev "$nic" name "$UPLINK"
    # The initramfs carries its own copy of the .link files.
    if command -v update-initramfs >/dev/null; then update-initramfs -u >/dev/null; fi
fi

addrs=$(ip -o -4 addr show dev "$UPLINK")
if [[ -n $addrs ]]; then
    say "warning: $UPLINK carries IPv4 addresses; a bridge-mode NAD refuses it unless moveUplinkAddresses is set"
fi

unit=/etc/systemd/system/edgelink-uplink.service
cat > "$unit.new" <<EOF
# edgelink lab (vagrant/provision/edge.sh)
[Unit]
Description=Uplink $UPLINK to the private segment up, without addresses
BindsTo=sys-subsystem-net-devices-$UPLINK.device
After=sys-subsystem-net-devices-$UPLINK.device

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/sbin/ip link set dev $UPLINK up

[Install]
WantedBy=multi-user.target
EOF
mv "$unit.new" "$unit"
systemctl daemon-reload
systemctl enable --now edgelink-uplink.service >/dev/null 2>&1
ip link set dev "$UPLINK" up
say "uplink $UPLINK ($(cat "/sys/class/net/$UPLINK/address")) is up"
