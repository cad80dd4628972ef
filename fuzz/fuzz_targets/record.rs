//! An attachment record file as the daemon reads it (`Record::parse`, what
//! `RecordStore::list` runs on every file), and what the daemon derives
//! from it before touching a namespace.
//!
//! Checks: a record that parses, written back as the plugin writes it
//! (`Record::encode`), parses to the same record, and encoding is stable;
//! its file name is one path component of at most 205 bytes that the store
//! recognises as this attachment's; the nftables plan the daemon would
//! build from its kernel-path forwards renders, or is refused with an
//! error (never a panic), and a rendered plan only DNATs to targets inside
//! `allowedTargets`.
#![no_main]

use edgelink_attachment::{ForwardPath, Record, RecordStore};
use edgelink_kernel_path::{render, KernelForward, Plan};
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let path = Path::new("/var/lib/edgelink/attachments/fuzz.json");
    let Ok(rec) = Record::parse(path, data) else {
        return;
    };
    let bytes = rec.encode().expect("a parsed record encodes");
    let back = Record::parse(path, &bytes).expect("our own encoding parses");
    assert_eq!(back, rec, "round trip\n{}", String::from_utf8_lossy(&bytes));
    assert_eq!(back.encode().unwrap(), bytes, "encoding is stable");

    let store = RecordStore::new(Path::new("/var/lib/edgelink"));
    let file = store.path(&rec.container_id, &rec.ifname);
    assert_eq!(file.parent(), Some(store.dir()));
    let name = file.file_name().unwrap().to_str().unwrap();
    assert!(name.len() <= 205, "{name}");
    assert!(!name.starts_with('.') && name.ends_with(".json"), "{name}");
    assert!(RecordStore::may_name(name, &rec.container_id, &rec.ifname));

    // edgelinkd's KernelForwards::new: the kernel-path forwards whose
    // target is allowed, into one plan for the attachment's table.
    let forwards: Vec<KernelForward> = rec
        .forwards
        .iter()
        .filter(|f| f.path == ForwardPath::Kernel && f.target_allowed(&rec.allowed_targets))
        .map(|f| KernelForward {
            name: f.name.clone(),
            protocol: f.protocol,
            port: f.port,
            target: f.target,
        })
        .collect();
    if forwards.is_empty() {
        return;
    }
    let plan = Plan {
        table: "edgelink".into(),
        private_ifname: rec.interface.name.clone(),
        cluster_ifname: Some("eth0".into()),
        forwards,
        allowed: rec.allowed_targets.clone(),
    };
    if let Ok(nft) = render(&plan) {
        let text = serde_json::to_string(&nft).expect("nft JSON encodes");
        for f in &plan.forwards {
            assert!(plan.allowed.iter().any(|n| n.contains(f.target.ip())));
            assert!(text.contains(&format!("{}-conn", f.name)), "{text}");
        }
    }
});
