//! The allocator: round-robin, skips, sticky, requested, exhaustion, idempotency, families.

use super::*;

#[test]
fn result_carries_prefix_gateway_and_set() {
    let env = Env::new();
    let a = env.alloc(&small(), &Owner::new("c1", "net1")).unwrap();
    assert_eq!(
        a,
        vec![Allocation {
            address: "10.0.0.10/24".parse().unwrap(),
            gateway: Some(ip("10.0.0.1")),
            range_set: 0,
        }]
    );
    assert_eq!(env.holder(ip("10.0.0.10")).as_deref(), Some("c1"));
    let content: Value =
        serde_json::from_slice(&std::fs::read(env.dir().join("10.0.0.10")).unwrap()).unwrap();
    for key in [
        "containerId",
        "ifname",
        "podNamespace",
        "podName",
        "podUid",
        "reservedAt",
    ] {
        assert!(content.get(key).is_some(), "{key} missing in {content}");
    }
    assert_eq!(
        env.store.reserved_by("c1", "net1").unwrap(),
        vec![ip("10.0.0.10")]
    );
    assert_eq!(
        env.store.reserved_by("c1", "net2").unwrap(),
        Vec::<IpAddr>::new()
    );
    assert_eq!(
        env.store.reserved_by("c2", "net1").unwrap(),
        Vec::<IpAddr>::new()
    );
}

#[test]
fn round_robin_does_not_reuse_a_just_released_address() {
    let env = Env::new();
    let c = small();
    assert_eq!(env.take(&c, "a"), vec![ip("10.0.0.10")]);
    assert_eq!(env.take(&c, "b"), vec![ip("10.0.0.11")]);
    assert_eq!(env.release("a", "net1").unwrap(), vec![ip("10.0.0.10")]);
    assert_eq!(
        env.take(&c, "c"),
        vec![ip("10.0.0.12")],
        "continues after the last reserved"
    );
    assert_eq!(env.take(&c, "d"), vec![ip("10.0.0.13")]);
    assert_eq!(env.take(&c, "e"), vec![ip("10.0.0.14")]);
    assert_eq!(
        env.take(&c, "f"),
        vec![ip("10.0.0.10")],
        "wraps to the released one"
    );
    let err = env.alloc(&c, &Owner::new("g", "net1")).unwrap_err();
    match &err {
        IpamError::Exhausted { network, ranges } => {
            assert_eq!(network, NET);
            assert_eq!(ranges, "10.0.0.10-10.0.0.14 (10.0.0.0/24)");
        }
        other => panic!("expected Exhausted, got {other:?}"),
    }
    assert!(
        err.to_string().contains("plant-floor") && err.to_string().contains("10.0.0.10-10.0.0.14")
    );
    assert!(
        !env.dir().join("owners").join("g_net1").exists(),
        "no index left by a failed ADD"
    );
}

#[test]
fn network_broadcast_gateway_and_excludes_are_skipped() {
    let env = Env::new();
    let c = cfg(json!({
        "ranges": [[{"subnet": "10.1.0.0/28", "rangeStart": "10.1.0.0", "rangeEnd": "10.1.0.15", "gateway": "10.1.0.1"}]],
        "exclude": ["10.1.0.2/31", "10.1.0.9"]
    }));
    let mut got = BTreeSet::new();
    while let Ok(a) = env.alloc(&c, &Owner::new(format!("c{}", got.len()), "net1")) {
        got.insert(a[0].address.ip());
    }
    let want: BTreeSet<IpAddr> = [4, 5, 6, 7, 8, 10, 11, 12, 13, 14]
        .iter()
        .map(|o| ip(&format!("10.1.0.{o}")))
        .collect();
    assert_eq!(got, want);
}

#[test]
fn multiple_ranges_in_a_set_are_used_in_order() {
    let env = Env::new();
    let c = cfg(json!({"ranges": [[
        {"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.10", "rangeEnd": "10.0.0.11", "gateway": "10.0.0.1"},
        {"subnet": "10.0.5.0/24", "rangeStart": "10.0.5.20", "rangeEnd": "10.0.5.20", "gateway": "10.0.5.1"}]]}));
    assert_eq!(env.take(&c, "a"), vec![ip("10.0.0.10")]);
    assert_eq!(env.take(&c, "b"), vec![ip("10.0.0.11")]);
    let third = env.alloc(&c, &Owner::new("c", "net1")).unwrap();
    assert_eq!(third[0].address.to_string(), "10.0.5.20/24");
    assert_eq!(
        third[0].gateway,
        Some(ip("10.0.5.1")),
        "gateway of the range the address is in"
    );
}

#[test]
fn allocation_is_idempotent_per_container_and_ifname() {
    let env = Env::new();
    let c = small();
    let o = Owner::new("c1", "net1");
    let first = env.alloc(&c, &o).unwrap();
    let again = env.alloc(&c, &o).unwrap();
    assert_eq!(first, again);
    // Even with a request for another address of that set.
    let third = env
        .alloc_with(&c, &o, &[ip("10.0.0.13")], &mut |_| false)
        .unwrap();
    assert_eq!(third, first);
    assert_eq!(env.reserved().len(), 1);
    // Another interface of the same container is another attachment.
    let other_if = env.alloc(&c, &Owner::new("c1", "net2")).unwrap();
    assert_ne!(addrs(&other_if), addrs(&first));
    assert_eq!(env.reserved().len(), 2);
}

#[test]
fn sticky_address_comes_back_to_the_same_pod() {
    let env = Env::new();
    let c = small();
    let web = pod("c1", "net1", "hil", "web-0");
    assert_eq!(addrs(&env.alloc(&c, &web).unwrap()), vec![ip("10.0.0.10")]);
    env.release("c1", "net1").unwrap();
    env.take(&c, "x"); // 10.0.0.11, cursor moves on
                       // The pod is recreated with a new container ID: it gets .10 back.
    let web2 = pod("c2", "net1", "hil", "web-0");
    assert_eq!(addrs(&env.alloc(&c, &web2).unwrap()), vec![ip("10.0.0.10")]);
    // Another interface of that pod, or another pod, is not sticky to it.
    env.release("c2", "net1").unwrap();
    let other_if = pod("c3", "net2", "hil", "web-0");
    assert_eq!(
        addrs(&env.alloc(&c, &other_if).unwrap()),
        vec![ip("10.0.0.12")]
    );
    let other_pod = pod("c4", "net1", "hil", "web-1");
    assert_eq!(
        addrs(&env.alloc(&c, &other_pod).unwrap()),
        vec![ip("10.0.0.13")]
    );
    // When the sticky address is taken, round-robin decides.
    env.take(&c, "y"); // .14
    env.take(&c, "z"); // .10 (wraps; free since c2 released it)
    let web3 = pod("c5", "net1", "hil", "web-0");
    let err = env.alloc(&c, &web3).unwrap_err();
    assert!(matches!(err, IpamError::Exhausted { .. }), "{err:?}");
    env.release("x", "net1").unwrap();
    assert_eq!(addrs(&env.alloc(&c, &web3).unwrap()), vec![ip("10.0.0.11")]);
}

#[test]
fn requested_addresses() {
    let env = Env::new();
    let c = cfg(json!({"ranges": [
        [{"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.10", "rangeEnd": "10.0.0.20", "gateway": "10.0.0.1"}],
        [{"subnet": "fd00::/120", "gateway": "fd00::1"}]],
        "exclude": ["10.0.0.15/32"]}));
    let mut probed = Vec::new();
    // A free requested address, not probed; the other set is allocated normally.
    let a = env
        .alloc_with(
            &c,
            &Owner::new("a", "net1"),
            &[ip("10.0.0.17")],
            &mut |ip| {
                probed.push(ip);
                false
            },
        )
        .unwrap();
    assert_eq!(addrs(&a), vec![ip("10.0.0.17"), ip("fd00::2")]);
    assert_eq!(probed, vec![ip("fd00::2")]);
    // Taken by someone else: the error names the holder.
    let err = env
        .alloc_with(
            &c,
            &Owner::new("b", "net1"),
            &[ip("10.0.0.17")],
            &mut |_| false,
        )
        .unwrap_err();
    match &err {
        IpamError::RequestedTaken {
            ip: i,
            container_id,
            ifname,
        } => {
            assert_eq!(
                (*i, container_id.as_str(), ifname.as_str()),
                (ip("10.0.0.17"), "a", "net1")
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("10.0.0.17") && err.to_string().contains("\"a\""));
    // Not allocatable: outside, gateway, excluded, two for one set.
    for bad in [
        &["10.0.0.9"][..],
        &["10.9.9.9"],
        &["10.0.0.1"],
        &["10.0.0.15"],
        &["fd00::1"],
        &["10.0.0.11", "10.0.0.12"],
    ] {
        let req: Vec<IpAddr> = bad.iter().map(|s| ip(s)).collect();
        let err = env
            .alloc_with(&c, &Owner::new("b", "net1"), &req, &mut |_| false)
            .unwrap_err();
        assert!(
            matches!(err, IpamError::RequestedOutOfRange { .. }),
            "{bad:?}: {err:?}"
        );
    }
    assert_eq!(env.reserved().len(), 2, "failed requests reserved nothing");
    // Both families requested; the same address twice is one request.
    let b = env
        .alloc_with(
            &c,
            &Owner::new("b", "net1"),
            &[ip("fd00::80"), ip("10.0.0.10"), ip("10.0.0.10")],
            &mut |_| true,
        )
        .unwrap();
    assert_eq!(
        addrs(&b),
        vec![ip("10.0.0.10"), ip("fd00::80")],
        "requested ones are not probed"
    );
}

#[test]
fn exhaustion_in_one_set_rolls_back_the_other() {
    let env = Env::new();
    let c = cfg(json!({"ranges": [
        [{"subnet": "10.0.0.0/24"}],
        [{"subnet": "fd00::/126"}]]}));
    // fd00::/126 has fd00::1..fd00::3.
    for n in 0..3 {
        env.take(&c, &format!("c{n}"));
    }
    let before = env.leftovers();
    let cursor_before = std::fs::read_to_string(env.dir().join("last_reserved_ip.0")).unwrap();
    let err = env.alloc(&c, &pod("big", "net1", "ns", "p")).unwrap_err();
    match &err {
        IpamError::Exhausted { ranges, .. } => assert_eq!(ranges, "fd00::1-fd00::3 (fd00::/126)"),
        other => panic!("{other:?}"),
    }
    assert_eq!(env.leftovers(), before, "nothing of set 0 is kept");
    assert_eq!(
        std::fs::read_to_string(env.dir().join("last_reserved_ip.0")).unwrap(),
        cursor_before
    );
    assert!(!env.dir().join("sticky").join("ns_p_net1").exists());
}

#[test]
fn ipv6_and_dual_stack() {
    let env = Env::new();
    let c = cfg(json!({"ranges": [
        [{"subnet": "172.17.16.0/24", "rangeStart": "172.17.16.200", "rangeEnd": "172.17.16.250", "gateway": "172.17.16.1"}],
        [{"subnet": "2001:db8:1::/64", "gateway": "2001:db8:1::1"}]]}));
    let a = env.alloc(&c, &Owner::new("a", "net1")).unwrap();
    assert_eq!(a.len(), 2);
    assert_eq!(a[0].address.to_string(), "172.17.16.200/24");
    assert_eq!(
        (a[1].address.to_string(), a[1].range_set),
        ("2001:db8:1::2/64".to_string(), 1)
    );
    assert_eq!(a[1].gateway, Some(ip("2001:db8:1::1")));
    assert!(env.dir().join("2001:db8:1::2").is_file());
    let b = env.alloc(&c, &Owner::new("b", "net1")).unwrap();
    assert_eq!(addrs(&b), vec![ip("172.17.16.201"), ip("2001:db8:1::3")]);
    assert_eq!(env.store.reserved_by("a", "net1").unwrap(), addrs(&a));
    let mut released = env.release("a", "net1").unwrap();
    released.sort();
    let mut want = addrs(&a);
    want.sort();
    assert_eq!(released, want);
    assert_eq!(env.reserved().len(), 2);
}

#[test]
fn probe_callback_skips_answering_candidates() {
    let env = Env::new();
    let c = small();
    let mut asked = Vec::new();
    let a = env
        .alloc_with(&c, &Owner::new("a", "net1"), &[], &mut |ip| {
            asked.push(ip);
            ip == self::ip("10.0.0.10") || ip == self::ip("10.0.0.11")
        })
        .unwrap();
    assert_eq!(addrs(&a), vec![ip("10.0.0.12")]);
    assert_eq!(
        asked,
        vec![ip("10.0.0.10"), ip("10.0.0.11"), ip("10.0.0.12")]
    );
    // Taken addresses are not probed; everything answering = exhausted.
    let mut asked = Vec::new();
    let err = env
        .alloc_with(&c, &Owner::new("b", "net1"), &[], &mut |ip| {
            asked.push(ip);
            true
        })
        .unwrap_err();
    assert!(matches!(err, IpamError::Exhausted { .. }));
    assert_eq!(asked.len(), 4, "4 free candidates probed: {asked:?}");
    assert!(!asked.contains(&ip("10.0.0.12")));
    // A sticky address that now answers is skipped too.
    let web = pod("w1", "net1", "ns", "web");
    assert_eq!(addrs(&env.alloc(&c, &web).unwrap()), vec![ip("10.0.0.13")]);
    env.release("w1", "net1").unwrap();
    let web2 = pod("w2", "net1", "ns", "web");
    let got = env
        .alloc_with(&c, &web2, &[], &mut |ip| ip == self::ip("10.0.0.13"))
        .unwrap();
    assert_eq!(addrs(&got), vec![ip("10.0.0.14")]);
}

#[test]
fn release_is_idempotent_and_never_touches_another_owner() {
    let env = Env::new();
    let c = small();
    let a = env.take(&c, "a");
    assert_eq!(env.release("nobody", "net1").unwrap(), Vec::<IpAddr>::new());
    // A stale index for "b" listing a's address (crash + re-allocation).
    let idx = json!({"containerId": "b", "ifname": "net1", "ips": [a[0].to_string(), "10.0.0.14"]});
    env.write("owners/b_net1", idx.to_string().as_bytes());
    assert_eq!(env.release("b", "net1").unwrap(), Vec::<IpAddr>::new());
    assert_eq!(
        env.holder(a[0]).as_deref(),
        Some("a"),
        "a's reservation survives b's DEL"
    );
    assert!(!env.dir().join("owners/b_net1").exists());
    assert_eq!(env.release("a", "net1").unwrap(), a);
    assert_eq!(
        env.release("a", "net1").unwrap(),
        Vec::<IpAddr>::new(),
        "repeated DEL is fine"
    );
    assert!(env.leftovers().is_empty(), "{:?}", env.leftovers());
}

#[test]
fn unusual_ids_are_escaped_safely() {
    let env = Env::new();
    let c = small();
    let weird = Owner {
        container_id: "../../etc/x_y".into(),
        ifname: "..".into(),
        pod_namespace: Some("a/b".into()),
        pod_name: Some("x".repeat(400)),
        pod_uid: None,
    };
    let a = env.alloc(&c, &weird).unwrap();
    assert_eq!(
        env.store.reserved_by("../../etc/x_y", "..").unwrap(),
        addrs(&a)
    );
    for sub in ["owners", "sticky"] {
        for e in std::fs::read_dir(env.dir().join(sub)).unwrap() {
            let name = e.unwrap().file_name().into_string().unwrap();
            assert!(
                !name.contains('/') && !name.starts_with('.') && name.len() < 255,
                "{name}"
            );
        }
    }
    assert_eq!(env.release("../../etc/x_y", "..").unwrap(), addrs(&a));
}

#[test]
fn open_refuses_bad_network_names_and_lock_times_out() {
    let dir = tempfile::tempdir().unwrap();
    for bad in ["", "../x", "a/b", ".hidden", "-x"] {
        let err = Store::open(dir.path(), bad).unwrap_err();
        assert!(err.to_string().contains("network name"), "{bad}: {err}");
    }
    let store = Store::open(dir.path(), "net.1_a-b").unwrap();
    let meta = std::fs::metadata(store.dir()).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(meta.permissions().mode() & 0o777, 0o700);
    let other = Store::open(dir.path(), "net.1_a-b").unwrap();
    let held = store.lock(Duration::from_secs(1)).unwrap();
    let err = other.lock(Duration::from_millis(30)).unwrap_err();
    match &err {
        IpamError::LockTimeout { path, waited } => {
            assert_eq!(path, &store.dir().join("lock"));
            assert!(*waited >= Duration::from_millis(30));
        }
        e => panic!("{e:?}"),
    }
    drop(held);
    other.lock(Duration::from_millis(30)).unwrap();
}
