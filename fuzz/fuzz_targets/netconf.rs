//! The plugin's network configuration: stdin through `NetConf::parse` and
//! `Config::parse`, exactly as `edgelink` runs them for ADD (CHECK, STATUS
//! and GC parse the same way). The input is the stdin config, optionally
//! followed by a NUL byte and CNI_ARGS (`MAC=`, `IP=` feed the config).
//!
//! Checks, on every config that validates, the invariants the commands
//! rely on: type "edgelink"; interface names (bridge, uplink) valid; VLAN
//! 1..=4094, MTU 68..=65535; a unicast MAC; an absolute stateDir; requested
//! IPs only with an IPAM; a delegated IPAM's name safe to join to CNI_PATH;
//! the built-in IPAM's ranges inside their canonical subnets, start <= end,
//! one family per set; forwards with unique valid names (a Kubernetes port
//! name), unique (protocol, port), port and target port non-zero, a unicast
//! target inside the allowed networks, timeouts and caps in their bounds,
//! no relay-only or TCP-only setting where it does not apply; and forwards
//! that survive the record's JSON unchanged. Any config that parses is
//! passed on (to a delegated IPAM, into the record) unchanged.
#![no_main]

use edgelink::config::{Config, Ipam, Mode};
use edgelink_attachment::{Forward, ForwardPath, Protocol};
use edgelink_cni_exec::is_plugin_name;
use edgelink_cni_spec::env::is_valid_ifname;
use edgelink_cni_spec::{Env, NetConf};
use libfuzzer_sys::fuzz_target;
use std::collections::HashSet;

fuzz_target!(|data: &[u8]| {
    let (stdin, cni_args) = match data.iter().position(|b| *b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let cni_args = String::from_utf8_lossy(cni_args).into_owned();
    let env = Env::from_lookup(|k| match k {
        "CNI_COMMAND" => Some("ADD".into()),
        "CNI_CONTAINERID" => Some("c1".into()),
        "CNI_IFNAME" => Some("net1".into()),
        "CNI_NETNS" => Some("/run/netns/x".into()),
        "CNI_PATH" => Some("/opt/cni/bin".into()),
        "CNI_ARGS" => Some(cni_args.clone()),
        _ => None,
    })
    .expect("a valid environment");
    let Ok(net) = NetConf::parse(stdin) else {
        return;
    };
    // What a delegated IPAM gets on stdin, and the record's cniConfig:
    // the config as received, every value unchanged.
    let again: serde_json::Value = serde_json::from_str(&net.raw.to_string()).unwrap();
    assert_eq!(again, net.raw, "the config changes when passed on");
    let Ok(cfg) = Config::parse(net, &env) else {
        return;
    };
    check(&cfg);
});

fn check(cfg: &Config) {
    assert_eq!(cfg.net.plugin_type, "edgelink");
    assert!(cfg.net.raw.is_object());
    match &cfg.mode {
        Mode::Bridge(b) => {
            assert!(is_valid_ifname(&b.name), "bridge {:?}", b.name);
            if let Some(u) = &b.uplink {
                assert!(is_valid_ifname(u), "uplink {u:?}");
            }
            if let Some(v) = b.vlan {
                assert!((1..=4094).contains(&v));
            }
        }
        Mode::Macvlan(m) => assert!(is_valid_ifname(&m.uplink), "uplink {:?}", m.uplink),
    }
    if let Some(mtu) = cfg.mtu {
        assert!((68..=65535).contains(&mtu));
    }
    if let Some(mac) = cfg.mac {
        assert_eq!(mac[0] & 1, 0, "multicast MAC {mac:02x?}");
    }
    assert!(cfg.state_dir.is_absolute(), "{:?}", cfg.state_dir);

    let own = match &cfg.ipam {
        Ipam::None => {
            assert!(cfg.requested_ips.is_empty());
            Vec::new()
        }
        Ipam::Delegated { plugin } => {
            assert!(is_plugin_name(plugin), "{plugin:?}");
            assert!(!plugin.contains('/') && plugin != "." && plugin != "..");
            Vec::new()
        }
        Ipam::Builtin(ic) => {
            for set in &ic.range_sets {
                let Some(first) = set.ranges.first() else {
                    panic!("an empty range set");
                };
                for r in &set.ranges {
                    assert_eq!(r.subnet.ip(), r.subnet.network(), "{r:?}");
                    assert_eq!(r.subnet.is_ipv4(), first.subnet.is_ipv4(), "{set:?}");
                    assert!(
                        r.subnet.contains(r.start) && r.subnet.contains(r.end),
                        "{r:?}"
                    );
                    assert_eq!(r.start.is_ipv4(), r.end.is_ipv4());
                    assert!(
                        r.contains(r.start) && r.contains(r.end),
                        "start > end: {r:?}"
                    );
                    if let Some(g) = r.gateway {
                        assert!(r.subnet.contains(g), "{r:?}");
                    }
                }
            }
            ic.subnets()
        }
    };
    // With the built-in IPAM, or explicit allowedTargets, targets are
    // checked before anything is touched (delegated: after its ADD).
    if matches!(cfg.ipam, Ipam::Builtin(_)) || cfg.allowed_targets.is_some() {
        let allowed = cfg.allowed(&own);
        for f in &cfg.forwards {
            assert!(f.target_allowed(&allowed), "{f:?} outside {allowed:?}");
        }
    }

    let mut names = HashSet::new();
    let mut ports = HashSet::new();
    for f in &cfg.forwards {
        check_forward(f);
        assert!(names.insert(&f.name), "forward name {:?} twice", f.name);
        assert!(
            ports.insert((f.protocol, f.port)),
            "{} {} twice",
            f.protocol,
            f.port
        );
    }
    let text = serde_json::to_string(&cfg.forwards).unwrap();
    let back: Vec<Forward> = serde_json::from_str(&text).unwrap();
    assert_eq!(back, cfg.forwards, "forwards through the record's JSON");
}

fn check_forward(f: &Forward) {
    let n = &f.name;
    assert!(!n.is_empty() && n.len() <= 15, "{n:?}");
    assert!(n
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'));
    assert!(!n.starts_with('-') && !n.ends_with('-'), "{n:?}");
    assert_ne!(f.port, 0);
    assert_ne!(f.target.port(), 0);
    let ip = f.target.ip();
    assert!(!ip.is_unspecified() && !ip.is_multicast(), "{f:?}");
    assert!((1..=600_000).contains(&f.connect_timeout_ms));
    if let Some(ms) = f.idle_timeout_ms {
        assert!(ms == 0 || (1000..=edgelink::config::MAX_IDLE_TIMEOUT_MS).contains(&ms));
    }
    if let Some(c) = f.max_connections {
        assert!((1..=edgelink::config::MAX_CONNECTIONS).contains(&u64::from(c)));
    }
    if let Some(ms) = f.queue_timeout_ms {
        assert!((1..=edgelink::config::MAX_QUEUE_TIMEOUT_MS).contains(&ms));
    }
    if let Some(r) = f.connect_retries {
        assert!(u64::from(r) <= edgelink::config::MAX_CONNECT_RETRIES);
    }
    let relay_only = f.idle_timeout_ms.is_some()
        || f.max_connections.is_some()
        || f.queue_timeout_ms.is_some()
        || f.connect_retries.is_some()
        || f.proxy_protocol.is_some();
    if f.protocol == Protocol::Udp || f.path == ForwardPath::Kernel {
        assert!(!relay_only, "{f:?}");
    }
}
