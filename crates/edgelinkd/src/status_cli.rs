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

pub fn table(s: &Status) -> String {
    let mut out = format!(
        "node {}  attachments {}  reclaimed {}{}\n",
        s.node,
        s.attachments.len(),
        s.reclaimed_total,
        if s.draining { "  DRAINING" } else { "" }
    );
    out.push_str(&format!(
        "{:<28} {:<10} {:<22} {:<10} {:>6} {:>8} {:>10} {:>10} {:>6}  {}\n",
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
                "{:<28} {:<10} {:<22} {:<10} {:>6} {:>8} {:>10} {:>10} {:>6}  {}{}\n",
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
