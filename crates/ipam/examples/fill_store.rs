//! Fill a network's store with N reservations through the public API, for
//! the scale benchmark (`scripts/bench/cni.py`).
//!
//!     fill_store STATE_DIR NETWORK IPAM_JSON N

use edgelink_ipam::{IpamConfig, Owner, Store};
use std::time::Duration;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() != 5 {
        eprintln!("usage: fill_store STATE_DIR NETWORK IPAM_JSON N");
        std::process::exit(64);
    }
    let ipam: serde_json::Value = serde_json::from_str(&a[3]).expect("IPAM_JSON");
    let node = edgelink_ipam::node_name_override(&ipam).unwrap_or_default();
    let cfg = IpamConfig::from_json(&ipam, &node).expect("valid ipam config");
    let n: usize = a[4].parse().expect("N");
    let store = Store::open(a[1].as_ref(), &a[2]).expect("open store");
    let mut lock = store.lock(Duration::from_secs(10)).expect("lock");
    for i in 0..n {
        let owner = Owner::new(format!("fill-{i}"), "net1".to_string());
        lock.allocate(&cfg, &owner, &[], &mut |_| false)
            .expect("allocate");
    }
}
