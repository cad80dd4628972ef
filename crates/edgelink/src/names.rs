//! Names derived from (container ID, ifname), so DEL finds what ADD made
//! without any state.

use sha2::{Digest, Sha256};

fn digest(container_id: &str, ifname: &str) -> String {
    let mut h = Sha256::new();
    h.update(container_id.as_bytes());
    h.update([0]);
    h.update(ifname.as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The node-side veth of a bridge attachment: `elk` + 12 hex digits.
pub fn host_veth(container_id: &str, ifname: &str) -> String {
    format!("elk{}", &digest(container_id, ifname)[..12])
}

/// The temporary name of a macvlan before it is renamed to CNI_IFNAME.
pub fn temp_ifname(container_id: &str, ifname: &str) -> String {
    format!("elt{}", &digest(container_id, ifname)[..12])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_distinct_and_short() {
        let a = host_veth("c1", "net1");
        assert_eq!(a, host_veth("c1", "net1"));
        assert_ne!(a, host_veth("c1", "net2"));
        assert_ne!(a, host_veth("c2", "net1"));
        // "c1"+"0net1" must not collide with "c10"+"net1".
        assert_ne!(host_veth("c1", "0net1"), host_veth("c10", "net1"));
        assert_eq!(a.len(), 15);
        assert_eq!(temp_ifname("c1", "net1").len(), 15);
        assert_ne!(temp_ifname("c1", "net1"), a);
    }
}
