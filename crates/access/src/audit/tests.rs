use super::*;

/// The origin of a forward of attachment `lab/p-0` of `device`, whose
/// rules name the client 10.244.1.5 `ci/runner-1`.
fn origin(device: &str) -> Arc<Origin> {
    let access = crate::Access::default();
    let rule = crate::AttachmentAccess {
        device: device.into(),
        allowed: Some(vec![crate::Client {
            address: "10.244.1.5".parse().unwrap(),
            pod: "ci/runner-1".into(),
        }]),
        lease: None,
    };
    access.replace(crate::AccessRules {
        generation: "g".into(),
        attachments: [("lab/p-0".to_string(), rule)].into(),
    });
    Arc::new(Origin {
        slot: access.slot("lab/p-0"),
        forward: "http".into(),
        protocol: "tcp",
        direction: "to-device",
    })
}

fn end(origin: &Arc<Origin>, at: SystemTime) -> End {
    End {
        origin: origin.clone(),
        client: "::ffff:10.244.1.5".parse().unwrap(),
        duration_ms: 5,
        bytes: (10, 20),
        ended: Ended::Closed,
        requests: None,
        at,
    }
}

/// Until the writer thread kept `n` lines (bounded).
fn written(a: &Audit, n: u64) {
    for _ in 0..500 {
        if a.counts().0 >= n {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("the writer kept {} of {n} lines", a.counts().0);
}

#[test]
fn lines_go_to_rotated_files_and_to_memory() {
    let dir = tempfile::tempdir().unwrap();
    let a = Audit::start(Settings {
        stdout: false,
        dir: Some(dir.path().join("audit")),
        max_file_bytes: 600,
        keep_files: 2,
        memory: 5,
    })
    .unwrap();
    let t0 = SystemTime::now() - Duration::from_secs(3600);
    let (one, other) = (origin("lab/device01-01"), origin("lab/other"));
    for i in 0..12 {
        let o = if i % 2 == 0 { &one } else { &other };
        a.log(end(o, t0 + Duration::from_secs(60 * i)));
        // One line per batch, so that each write can rotate.
        written(&a, i + 1);
    }
    let d = dir.path().join("audit");
    let current = std::fs::read_to_string(d.join(FILE)).unwrap();
    let line: Record = serde_json::from_str(current.lines().last().unwrap()).unwrap();
    assert_eq!(line.kind, "audit");
    assert_eq!(line.ended, Ended::Closed);
    assert_eq!(
        (line.client.as_str(), line.client_address.as_str()),
        ("ci/runner-1", "10.244.1.5")
    );
    assert_eq!((line.bytes_to_device, line.bytes_to_client), (10, 20));
    assert!(
        line.time.ends_with('Z') && line.time.contains('T'),
        "{}",
        line.time
    );
    assert!(d.join(format!("{FILE}.1")).exists() && d.join(format!("{FILE}.2")).exists());
    assert!(
        !d.join(format!("{FILE}.3")).exists(),
        "only two rotated files are kept"
    );
    for f in [FILE, "audit.log.1", "audit.log.2"] {
        let len = std::fs::metadata(d.join(f)).unwrap().len();
        assert!(len <= 600 + 400, "{f}: {len} bytes");
    }
    // Memory keeps the latest five; a device by name or namespace/name.
    assert_eq!(a.recent(None, None).len(), 5);
    assert_eq!(a.recent(Some("device01-01"), None).len(), 2);
    assert_eq!(a.recent(Some("lab/other"), None).len(), 3);
    let since = t0 + Duration::from_secs(60 * 10);
    assert_eq!(a.recent(None, Some(since)).len(), 2);
    // The webhook takes what it has not sent, once.
    assert_eq!(a.take_unsent(100).len(), 12);
    assert!(a.take_unsent(100).is_empty());
}

#[test]
fn an_audit_that_is_off_keeps_nothing() {
    let a = Audit::off();
    a.log(end(&origin("lab/d"), SystemTime::now()));
    assert!(!a.is_on());
    assert!(a.recent(None, None).is_empty());
    assert_eq!(a.counts(), (0, 0, 0));
}

#[test]
fn since_reads_durations() {
    let s = since("1h").unwrap();
    let ago = SystemTime::now().duration_since(s).unwrap();
    assert!(ago >= Duration::from_secs(3600) && ago < Duration::from_secs(3700));
    assert!(since("an hour").unwrap_err().contains("an hour"));
}
