use super::*;

fn record(device: &str, at: SystemTime) -> Record {
    Record {
        time: String::new(),
        kind: "audit".into(),
        device: device.into(),
        forward: "http".into(),
        protocol: "tcp".into(),
        direction: "to-device".into(),
        client: "ci/runner-1".into(),
        client_address: "10.244.1.5".into(),
        bytes_to_device: 10,
        bytes_to_client: 20,
        duration_ms: 5,
        ended: Ended::Closed,
        lease: None,
        at: None,
    }
    .stamp(at)
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
    for i in 0..12 {
        let device = if i % 2 == 0 {
            "lab/device01-01"
        } else {
            "lab/other"
        };
        a.log(record(device, t0 + Duration::from_secs(60 * i)));
        // One line per batch, so that each write can rotate.
        written(&a, i + 1);
    }
    let d = dir.path().join("audit");
    let current = std::fs::read_to_string(d.join(FILE)).unwrap();
    let line: Record = serde_json::from_str(current.lines().last().unwrap()).unwrap();
    assert_eq!(line.kind, "audit");
    assert_eq!(line.ended, Ended::Closed);
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
    a.log(record("lab/d", SystemTime::now()));
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
