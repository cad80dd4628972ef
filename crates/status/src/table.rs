//! `edgelinkd status`: a running daemon's /status as a table, narrowed to
//! a namespace, a pod or a forward, with an exit status for scripts and
//! probes: 0 when everything shown is well, [`EXIT_UNWELL`] when a listener
//! failed, a target or a device's health is unreachable, an attachment
//! failed or a record is malformed; 1 when the daemon cannot be asked.

use crate::{AttachmentStatus, ForwardStatus, HealthStatus, Status};

/// Something shown is not well.
pub const EXIT_UNWELL: i32 = 2;

fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// The table's columns: header, and whether numbers are right-aligned.
/// The last one (target state / last error) is never padded.
const COLUMNS: [(&str, bool); N] = [
    ("POD", false),
    ("ADDRESS", false),
    ("FORWARD", false),
    ("TARGET", false),
    ("LISTENER", false),
    ("ACTIVE", true),
    ("TOTAL", true),
    ("QUEUED", true),
    ("REFUSED", true),
    ("TO-TARGET", true),
    ("TO-CLIENT", true),
    ("ERRORS", true),
    ("TARGET-STATE / LAST ERROR", false),
];
const N: usize = 13;

/// Lay out `rows` under [`COLUMNS`]: each column as wide as its widest
/// cell (header included), two spaces between columns, so a long pod,
/// forward or target name moves the later columns instead of pushing its
/// own line out of them. Widths count characters, not bytes.
fn layout(rows: &[[String; N]]) -> String {
    let mut widths = COLUMNS.map(|(h, _)| h.chars().count());
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let header = COLUMNS.map(|(h, _)| h.to_string());
    let mut out = String::new();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            let (_, right) = COLUMNS[i];
            let pad = " ".repeat(widths[i] - cell.chars().count());
            if i + 1 == row.len() {
                line.push_str(cell);
            } else if right {
                line.push_str(&format!("{pad}{cell}  "));
            } else {
                line.push_str(&format!("{cell}{pad}  "));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// What `--namespace`, `--pod` and `--forward` keep.
#[derive(Debug, Default, Clone)]
pub struct Filter {
    pub namespace: Option<String>,
    /// A pod's name, or `namespace/name`.
    pub pod: Option<String>,
    pub forward: Option<String>,
}

impl Filter {
    fn attachment(&self, a: &AttachmentStatus) -> bool {
        let ns = a.pod_namespace.as_deref().unwrap_or("");
        let name = a.pod_name.as_deref().unwrap_or("");
        self.namespace.as_deref().is_none_or(|n| n == ns)
            && self.pod.as_deref().is_none_or(|p| match p.split_once('/') {
                Some((pns, pname)) => pns == ns && pname == name,
                None => p == name,
            })
            && (self.forward.is_none() || a.forwards.iter().any(|f| self.forward_ok(f)))
    }

    fn forward_ok(&self, f: &ForwardStatus) -> bool {
        self.forward.as_deref().is_none_or(|n| n == f.name)
    }

    /// `s` with only what the filter keeps.
    pub fn apply(&self, s: &Status) -> Status {
        let mut s = s.clone();
        s.attachments.retain(|a| self.attachment(a));
        for a in &mut s.attachments {
            a.forwards.retain(|f| self.forward_ok(f));
        }
        if self.namespace.is_some() || self.pod.is_some() || self.forward.is_some() {
            s.malformed_records.clear();
        }
        s
    }
}

/// What is not well in `s`, one line each (empty: all well).
pub fn unwell(s: &Status) -> Vec<String> {
    let mut out = Vec::new();
    for a in &s.attachments {
        let pod = pod_of(a);
        if a.state == "failed" {
            out.push(format!(
                "{pod}: attachment failed: {}",
                a.error.as_deref().unwrap_or("")
            ));
        }
        for f in &a.forwards {
            if matches!(f.listener.as_str(), "failed" | "refused") {
                out.push(format!("{pod}: forward {} is {}", f.name, f.listener));
            }
            if f.reachability.state == "unreachable" {
                out.push(format!(
                    "{pod}: forward {}: target {} is unreachable",
                    f.name, f.target
                ));
            }
        }
        if let Some(h) = a.health.as_ref().filter(|h| h.state == "unreachable") {
            out.push(format!(
                "{pod}: health: {} {} is unreachable: {}",
                h.kind,
                h.target,
                h.error.as_deref().unwrap_or("")
            ));
        }
    }
    for m in &s.malformed_records {
        out.push(format!("malformed record {}", m.path));
    }
    out
}

fn pod_of(a: &AttachmentStatus) -> String {
    format!(
        "{}/{}",
        a.pod_namespace.as_deref().unwrap_or("-"),
        a.pod_name
            .as_deref()
            .unwrap_or(&a.container_id[..a.container_id.len().min(12)])
    )
}

/// The attachment's addresses, without their prefix length.
fn address(a: &AttachmentStatus) -> String {
    let ips: Vec<String> = a.interface.ips.iter().map(|n| n.ip().to_string()).collect();
    if ips.is_empty() {
        "-".into()
    } else {
        ips.join(",")
    }
}

/// `/status` as a table: one line per forward. ACTIVE and TOTAL are the
/// forward's connections (a UDP forward's sessions, see
/// docs/configuration.md#counters); QUEUED the clients waiting now for a
/// place under `maxConnections`; REFUSED the connections and datagrams
/// refused (from the private side, or not an allowed source); ERRORS adds
/// connect errors and connections that ended with an error.
pub fn table(s: &Status) -> String {
    let mut out = format!(
        "node {}  attachments {}  reclaimed {}{}\n",
        s.node,
        s.attachments.len(),
        s.reclaimed_total,
        if s.draining { "  DRAINING" } else { "" }
    );
    let mut rows: Vec<[String; N]> = Vec::new();
    for a in &s.attachments {
        let pod = pod_of(a);
        let addr = address(a);
        if a.forwards.is_empty() {
            let mut row: [String; N] = Default::default();
            row[0] = pod.clone();
            row[1] = addr.clone();
            row[2] = "(no forwards)".into();
            row[N - 1] = a.error.clone().unwrap_or_default();
            rows.push(row);
        }
        for f in &a.forwards {
            // A reverse forward: marked, and a name target with the
            // address it resolves to now.
            let reverse = f.direction.as_deref() == Some("reverse");
            let target = match f.resolved.as_ref().and_then(|r| r.address.as_ref()) {
                Some(a) => format!("{} = {a}", f.target),
                None => f.target.clone(),
            };
            rows.push([
                pod.clone(),
                addr.clone(),
                format!(
                    "{}/{}{}",
                    f.name,
                    f.protocol,
                    if reverse { " (reverse)" } else { "" }
                ),
                target,
                f.listener.clone(),
                f.active_connections.to_string(),
                f.total_connections.to_string(),
                f.queued.to_string(),
                f.refused.to_string(),
                human(f.bytes_to_target),
                human(f.bytes_to_client),
                (f.connect_errors + f.errors).to_string(),
                format!(
                    "{}{}",
                    f.reachability.state,
                    f.last_error
                        .as_ref()
                        .map(|e| format!(" / {e}"))
                        .unwrap_or_default()
                ),
            ]);
        }
        if let Some(h) = &a.health {
            rows.push(health_row(pod.clone(), addr.clone(), h));
        }
        if let Some(v) = &a.virtual_addresses {
            rows.push(virtual_row(pod.clone(), addr.clone(), v));
        }
    }
    out.push_str(&layout(&rows));
    for m in &s.malformed_records {
        out.push_str(&format!("malformed record {}: {}\n", m.path, m.error));
    }
    out
}

/// The device health probe's line: `health/<type>` in FORWARD, its
/// counts where a forward has its connections, its state and latency (or
/// its last error) last.
fn health_row(pod: String, addr: String, h: &HealthStatus) -> [String; N] {
    let mut row: [String; N] = Default::default();
    row[0] = pod;
    row[1] = addr;
    row[2] = format!("health/{}", h.kind);
    row[3] = h.target.clone();
    row[4] = "-".into();
    row[6] = h.probes_total.to_string();
    row[11] = h.failures_total.to_string();
    let detail = match (&h.error, h.latency_ms) {
        (Some(e), _) => format!(" / {e}"),
        (None, Some(ms)) => format!(" ({ms:.2} ms)"),
        (None, None) => String::new(),
    };
    let skipped = match h.skipped_total {
        0 => String::new(),
        n => format!(" [{n} skipped: no free place]"),
    };
    row[N - 1] = format!("{}{detail}{skipped}", h.state);
    row
}

/// The virtual addresses' line: `virtual` in FORWARD, the addresses as
/// its target, held or not and who grants last.
fn virtual_row(pod: String, addr: String, v: &crate::VirtualStatus) -> [String; N] {
    let mut row: [String; N] = Default::default();
    row[0] = pod;
    row[1] = addr;
    row[2] = "virtual".into();
    row[3] = v.addresses.join(",");
    row[4] = "-".into();
    let held = if v.held { "held" } else { "not held" };
    let error = v
        .error
        .as_ref()
        .map(|e| format!(" / {e}"))
        .unwrap_or_default();
    row[N - 1] = format!("{held} ({}){error}", v.granted_by);
    row
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AttachmentStatus, ForwardStatus, Reachability};

    fn forward(name: &str, protocol: &str) -> ForwardStatus {
        ForwardStatus {
            name: name.into(),
            protocol: protocol.into(),
            port: 5000,
            target: "172.17.16.120:5000".into(),
            direction: None,
            listen: None,
            allowed_sources: None,
            resolved: None,
            listener: "listening".into(),
            active_connections: 0,
            total_connections: 1,
            bytes_to_target: 325,
            bytes_to_client: 325,
            connect_errors: 0,
            errors: 0,
            splice_fallbacks: 0,
            refused: 0,
            udp_sessions: 0,
            udp_sessions_total: 1,
            udp_evictions: 0,
            udp_datagrams_to_target: 0,
            udp_datagrams_to_client: 0,
            udp_drops: 0,
            idle_timeout_ms: 0,
            path: "relay".into(),
            max_connections: None,
            queue_timeout_ms: None,
            connect_retries: None,
            proxy_protocol: None,
            packets_to_target: None,
            packets_to_client: None,
            target_connections: None,
            queued: 0,
            queued_total: 0,
            queue_timeouts_total: 0,
            queue_full_total: 0,
            queue_abandoned_total: 0,
            connect_retries_total: 0,
            connect_latency: None,
            connections_rejected_total: 0,
            refused_by_policy_total: 0,
            refused_by_lease_total: 0,
            refused_from_node_total: 0,
            access_resets_total: 0,
            lease_waits_total: 0,
            lease_wait_timeouts_total: 0,
            modbus: None,
            idle_timeouts_total: 0,
            last_error: None,
            last_error_at: None,
            reachability: Reachability {
                state: "reachable".into(),
                checked_at: 0,
                error: None,
            },
        }
    }

    fn status(forwards: Vec<ForwardStatus>, pod_name: &str) -> Status {
        Status {
            node: "kedge1".into(),
            version: "0.1.0".into(),
            started_at: 0,
            last_reconcile_at: 0,
            draining: false,
            attachments: vec![AttachmentStatus {
                container_id: "c".repeat(64),
                ifname: "net1".into(),
                network: "plant-floor".into(),
                pod_namespace: Some("hil".into()),
                pod_name: Some(pod_name.into()),
                netns: "/run/netns/x".into(),
                mode: "bridge".into(),
                interface: edgelink_attachment::RecordInterface {
                    name: "net1".into(),
                    mac: "02:00:00:00:00:01".into(),
                    ips: vec![],
                },
                state: "serving".into(),
                error: None,
                forwards,
                health: None,
                virtual_addresses: None,
            }],
            malformed_records: vec![],
            reclaimed_total: 0,
            retired_links_deleted_total: 0,
            workers: 1,
            worker_replacements_total: 0,
            warnings: vec![],
        }
    }

    /// Where each column starts (left-aligned) or ends (right-aligned) in
    /// the header line.
    fn anchors(header: &str) -> Vec<usize> {
        COLUMNS
            .iter()
            .map(|(h, right)| {
                let at = header.find(h).unwrap();
                if *right {
                    at + h.len()
                } else {
                    at
                }
            })
            .collect()
    }

    // The kube lab's `edgelinkd status` showed `telemetry/udp` pushing its
    // line out of the columns (FORWARD was 10 wide); a long pod name or an
    // IPv6 target did the same to the columns after them.
    #[test]
    fn columns_are_as_wide_as_their_longest_cell() {
        let mut long = forward("abcdefghijklmno", "udp");
        long.target = "[fd00:e1::120]:50000".into();
        long.active_connections = 12345;
        long.total_connections = 1234567890;
        long.listener = "failed".into();
        long.last_error = Some("bind: address in use".into());
        let s = status(
            vec![forward("api", "tcp"), forward("telemetry", "udp"), long],
            "a-statefulset-pod-name-that-is-long-0",
        );
        let t = table(&s);
        let lines: Vec<&str> = t.lines().collect();
        let at = anchors(lines[1]);
        for l in &lines[2..] {
            for (i, (h, right)) in COLUMNS.iter().enumerate() {
                if *right {
                    // A right-aligned cell ends where its header ends, and
                    // is preceded by a space.
                    let before = &l[..at[i]];
                    assert!(
                        before.ends_with(|c: char| c.is_ascii_alphanumeric()),
                        "{h} in {l:?}\n{t}"
                    );
                    assert!(l[at[i]..].starts_with("  "), "{h} in {l:?}\n{t}");
                } else {
                    assert!(i == 0 || l[..at[i]].ends_with("  "), "{h} in {l:?}\n{t}");
                    assert_ne!(l.as_bytes()[at[i]], b' ', "{h} in {l:?}\n{t}");
                }
            }
        }
        assert!(lines[4].contains("abcdefghijklmno/udp"), "{t}");
        assert!(lines[4].contains("1234567890"), "{t}");
        assert!(
            lines[4].ends_with("reachable / bind: address in use"),
            "{t}"
        );
        // Nothing is padded after the last column.
        assert!(t.lines().all(|l| !l.ends_with(' ')), "{t}");
    }

    #[test]
    fn columns_stay_narrow_for_short_values() {
        let s = status(vec![forward("api", "tcp")], "p");
        let t = table(&s);
        let lines: Vec<&str> = t.lines().collect();
        // Each column is as wide as its widest cell: "hil/p", "api/tcp".
        assert!(
            lines[1].starts_with("POD    ADDRESS  FORWARD  TARGET  "),
            "{t}"
        );
        assert!(
            lines[2].starts_with("hil/p  -        api/tcp  172.17.16.120:5000"),
            "{t}"
        );
    }

    #[test]
    fn health_has_a_line_of_its_own_and_unreachable_is_unwell() {
        let mut s = status(vec![forward("api", "tcp")], "p");
        s.attachments[0].health = Some(HealthStatus {
            kind: "modbus".into(),
            target: "172.17.16.120:502".into(),
            state: "unreachable".into(),
            since: 1,
            since_ms: 1000,
            last_seen: None,
            checked_at: Some(2),
            latency_ms: None,
            error: Some(
                "modbus 172.17.16.120:502: exception 2 (illegal data address) from unit 1".into(),
            ),
            probes_total: 3,
            failures_total: 3,
            skipped_total: 1,
        });
        let t = table(&s);
        let line = t.lines().find(|l| l.contains("health/modbus")).expect(&t);
        assert!(line.contains("172.17.16.120:502"), "{t}");
        assert!(line.ends_with("unreachable / modbus 172.17.16.120:502: exception 2 (illegal data address) from unit 1 [1 skipped: no free place]"), "{t}");
        let u = unwell(&s);
        assert!(
            u.iter()
                .any(|l| l.contains("health: modbus 172.17.16.120:502 is unreachable")),
            "{u:?}"
        );
    }

    #[test]
    fn virtual_addresses_have_a_line_saying_whether_they_are_held() {
        let mut s = status(vec![forward("api", "tcp")], "p");
        s.attachments[0].virtual_addresses = Some(crate::VirtualStatus {
            addresses: vec!["172.17.16.60".into()],
            held: true,
            granted_by: "operator".into(),
            ..Default::default()
        });
        let t = table(&s);
        let line = t.lines().find(|l| l.contains("virtual")).expect(&t);
        assert!(
            line.contains("172.17.16.60") && line.ends_with("held (operator)"),
            "{t}"
        );
    }
}
