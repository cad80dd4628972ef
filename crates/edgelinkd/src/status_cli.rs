//! `edgelinkd status`: a running daemon's /status as a table.

use crate::config::StatusArgs;
use crate::model::Status;

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

/// The FORWARD column holds `<name>/<protocol>`: a forward name has at most
/// 15 characters, the protocol 3, so 19 keeps every column aligned.
pub fn table(s: &Status) -> String {
    let mut out = format!(
        "node {}  attachments {}  reclaimed {}{}\n",
        s.node,
        s.attachments.len(),
        s.reclaimed_total,
        if s.draining { "  DRAINING" } else { "" }
    );
    out.push_str(&format!(
        "{:<28} {:<19} {:<22} {:<10} {:>6} {:>8} {:>10} {:>10} {:>6}  {}\n",
        "POD",
        "FORWARD",
        "TARGET",
        "LISTENER",
        "ACTIVE",
        "TOTAL",
        "TO-TARGET",
        "TO-CLIENT",
        "ERRORS",
        "TARGET-STATE / LAST ERROR"
    ));
    for a in &s.attachments {
        let pod = format!(
            "{}/{}",
            a.pod_namespace.as_deref().unwrap_or("-"),
            a.pod_name
                .as_deref()
                .unwrap_or(&a.container_id[..a.container_id.len().min(12)])
        );
        if a.forwards.is_empty() {
            out.push_str(&format!(
                "{pod:<28} (no forwards) {}\n",
                a.error.as_deref().unwrap_or("")
            ));
        }
        for f in &a.forwards {
            let active = f.active_connections + f.udp_sessions;
            let total = if f.protocol == "udp" {
                f.udp_sessions_total
            } else {
                f.total_connections
            };
            out.push_str(&format!(
                "{:<28} {:<19} {:<22} {:<10} {:>6} {:>8} {:>10} {:>10} {:>6}  {}{}\n",
                pod,
                format!("{}/{}", f.name, f.protocol),
                f.target,
                f.listener,
                active,
                total,
                human(f.bytes_to_target),
                human(f.bytes_to_client),
                f.connect_errors + f.errors,
                f.reachability.state,
                f.last_error
                    .as_ref()
                    .map(|e| format!(" / {e}"))
                    .unwrap_or_default()
            ));
        }
    }
    for m in &s.malformed_records {
        out.push_str(&format!("malformed record {}: {}\n", m.path, m.error));
    }
    out
}

pub async fn run(args: StatusArgs) -> anyhow::Result<()> {
    let (code, body) = crate::http::get(args.status_addr, "/status")
        .await
        .map_err(|e| anyhow::anyhow!("cannot reach edgelinkd at {}: {e}", args.status_addr))?;
    if code != 200 {
        anyhow::bail!("edgelinkd at {} answered {code}: {body}", args.status_addr);
    }
    if args.json {
        println!("{body}");
        return Ok(());
    }
    let s: Status = serde_json::from_str(&body)?;
    print!("{}", table(&s));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{AttachmentStatus, ForwardStatus, Reachability};

    fn forward(name: &str, protocol: &str) -> ForwardStatus {
        ForwardStatus {
            name: name.into(),
            protocol: protocol.into(),
            port: 5000,
            target: "172.17.16.120:5000".into(),
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

    // The kube lab's `edgelinkd status` showed `telemetry/udp` pushing its
    // line out of the columns (FORWARD was 10 wide).
    #[test]
    fn columns_stay_aligned_with_the_longest_forward_names() {
        let s = Status {
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
                pod_name: Some("device01-01-0".into()),
                netns: "/run/netns/x".into(),
                mode: "bridge".into(),
                interface: edgelink_attachment::RecordInterface {
                    name: "net1".into(),
                    mac: "02:00:00:00:00:01".into(),
                    ips: vec![],
                },
                state: "serving".into(),
                error: None,
                forwards: vec![
                    forward("api", "tcp"),
                    forward("telemetry", "udp"),
                    forward("abcdefghijklmno", "udp"),
                ],
            }],
            malformed_records: vec![],
            reclaimed_total: 0,
            retired_links_deleted_total: 0,
            workers: 1,
            worker_replacements_total: 0,
            warnings: vec![],
        };
        let t = table(&s);
        let lines: Vec<&str> = t.lines().collect();
        let col = lines[1].find("TARGET").unwrap();
        for l in &lines[2..] {
            assert_eq!(l.find("172.17.16.120").unwrap(), col, "{t}");
        }
    }
}
