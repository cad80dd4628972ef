//! CNI_ARGS (`K=V;K=V`), read through the plugin's environment entry
//! (`Env::from_lookup`). Checks: every kept pair is trimmed, its key is not
//! empty and neither side holds `;`; `get` is the last value given; the
//! pairs written back as `K=V;...` parse to the same pairs; `IP=` gives
//! trimmed, non-empty entries without `,`.
#![no_main]

use edgelink_cni_spec::{CniArgs, Env};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(raw) = std::str::from_utf8(data) else {
        return;
    };
    let env = Env::from_lookup(|k| match k {
        "CNI_COMMAND" => Some("ADD".into()),
        "CNI_CONTAINERID" => Some("c1".into()),
        "CNI_IFNAME" => Some("net1".into()),
        "CNI_NETNS" => Some("/run/netns/x".into()),
        "CNI_ARGS" => Some(raw.to_string()),
        _ => None,
    })
    .expect("a valid environment apart from CNI_ARGS, which never fails it");
    let args = &env.args;
    assert_eq!(*args, CniArgs::parse(raw));

    for (k, v) in args.pairs() {
        assert!(!k.is_empty(), "empty key kept from {raw:?}");
        assert_eq!(k.trim(), k);
        assert_eq!(v.trim(), v);
        assert!(!k.contains(';') && !v.contains(';') && !k.contains('='));
        let last = args.pairs().iter().rev().find(|(k2, _)| k2 == k).unwrap();
        assert_eq!(args.get(k), Some(last.1.as_str()));
    }
    for m in &args.malformed {
        assert!(!m.is_empty() && !m.contains(';'));
    }

    let canonical: Vec<String> = args
        .pairs()
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let again = CniArgs::parse(&canonical.join(";"));
    assert_eq!(again.pairs(), args.pairs(), "{raw:?} → {canonical:?}");

    for ip in args.ips() {
        assert!(!ip.is_empty() && ip.trim() == ip && !ip.contains(','));
    }
    if let Some(mac) = args.mac() {
        assert!(!mac.is_empty());
    }
});
