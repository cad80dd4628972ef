//! ensure() is idempotent and replaces, remove() clears and is idempotent.

use crate::lab::*;
use crate::{full_plan, TABLE};
use edgelink_kernel_path::{ensure, list_table, remove};

/// `nft list ARGS` in the pod, run independently of the crate.
fn nft_list(lab: &Lab, args: &[&str]) -> String {
    let mut full = vec!["nft", "list"];
    full.extend_from_slice(args);
    let out = lab.pod.exec(&full);
    assert!(
        out.status.success(),
        "{full:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn ensure_twice_lists_the_same_and_a_new_plan_replaces_the_old() {
    let Some(nft) = nft_or_skip("ensure_twice_lists_the_same") else {
        return;
    };
    let lab = Lab::new();
    let opts = options(nft);
    let plan = full_plan();

    ensure(&lab.pod.netns, &plan, &opts).unwrap();
    let first = nft_list(&lab, &["table", "inet", TABLE]);
    assert_eq!(
        first.matches("dnat ip to 172.31.50.10:7000").count(),
        1,
        "{first}"
    );
    assert_eq!(first.matches("masquerade").count(), 1, "{first}");
    // Traffic between the two calls: counters are part of the listing.
    tcp_exchange(&lab.client, addr(POD, 8080), b"between").unwrap();
    ensure(&lab.pod.netns, &plan, &opts).unwrap();
    let second = nft_list(&lab, &["table", "inet", TABLE]);
    // Byte for byte: no rule doubled, and the counters started again.
    assert_eq!(first, second);
    assert_eq!(
        list_table(&lab.pod.netns, TABLE, &opts).unwrap().as_deref(),
        Some(second.as_str())
    );
    let ruleset = nft_list(&lab, &["ruleset"]);
    assert_eq!(ruleset.matches("table ").count(), 1, "{ruleset}");

    // One forward fewer: its rules and counters go, its port stops.
    let mut smaller = plan.clone();
    smaller.forwards.retain(|f| f.name != "dns");
    ensure(&lab.pod.netns, &smaller, &opts).unwrap();
    let third = nft_list(&lab, &["table", "inet", TABLE]);
    assert!(!third.contains("\"dns-"), "{third}");
    assert!(!third.contains("udp dport 5353"), "{third}");
    assert!(third.contains("\"dns6-conn\""), "{third}");
    assert!(udp_exchange(&lab.client, addr(POD, 5353), b"gone?", 2).is_err());
    assert_eq!(
        tcp_exchange(&lab.client, addr(POD, 8080), b"still").unwrap(),
        b"still"
    );
    // Going back gives the first listing again.
    ensure(&lab.pod.netns, &plan, &opts).unwrap();
    assert_eq!(nft_list(&lab, &["table", "inet", TABLE]), first);
}

#[test]
fn remove_leaves_an_empty_ruleset_and_forwarding_off() {
    let Some(nft) = nft_or_skip("remove_leaves_an_empty_ruleset") else {
        return;
    };
    let lab = Lab::new();
    let opts = options(nft);
    ensure(&lab.pod.netns, &full_plan(), &opts).unwrap();
    assert_eq!(lab.pod.read("/proc/sys/net/ipv4/ip_forward"), "1");
    assert_eq!(lab.pod.read("/proc/sys/net/ipv6/conf/all/forwarding"), "1");
    tcp_exchange(&lab.client, addr(POD, 8080), b"up").unwrap();

    assert!(remove(&lab.pod.netns, TABLE, &opts).unwrap());
    assert_eq!(nft_list(&lab, &["ruleset"]).trim(), "");
    assert_eq!(list_table(&lab.pod.netns, TABLE, &opts).unwrap(), None);
    assert_eq!(lab.pod.read("/proc/sys/net/ipv4/ip_forward"), "0");
    assert_eq!(lab.pod.read("/proc/sys/net/ipv6/conf/all/forwarding"), "0");
    // Nothing listens on the pod's 8080: without the DNAT it is refused.
    let refused = tcp_exchange(&lab.client, addr(POD, 8080), b"down").unwrap_err();
    assert_eq!(
        refused.kind(),
        std::io::ErrorKind::ConnectionRefused,
        "{refused}"
    );

    assert!(!remove(&lab.pod.netns, TABLE, &opts).unwrap());
    // Without a table, remove touches nothing, not even forwarding.
    lab.pod.write("/proc/sys/net/ipv4/ip_forward", "1");
    assert!(!remove(&lab.pod.netns, TABLE, &opts).unwrap());
    assert_eq!(lab.pod.read("/proc/sys/net/ipv4/ip_forward"), "1");
}
