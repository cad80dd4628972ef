//! `edgelinkd audit`: ask a running daemon for the last connections it
//! relayed or refused (`/audit`) and print them.

use edgelink_access::Record;
use edgelinkd::config::AuditArgs;

/// Print the lines; the exit status 0.
pub async fn run(args: AuditArgs) -> anyhow::Result<i32> {
    let mut path = String::from("/audit");
    let params: Vec<String> = [
        args.device
            .as_ref()
            .map(|d| format!("device={}", d.replace('/', "%2F"))),
        args.since.as_ref().map(|s| format!("since={s}")),
    ]
    .into_iter()
    .flatten()
    .collect();
    if !params.is_empty() {
        path = format!("{path}?{}", params.join("&"));
    }
    let (code, body) = edgelink_status::http::get(args.status_addr, &path)
        .await
        .map_err(|e| anyhow::anyhow!("cannot reach edgelinkd at {}: {e}", args.status_addr))?;
    if code != 200 {
        anyhow::bail!("edgelinkd at {} answered {code}: {body}", args.status_addr);
    }
    if args.json {
        print!("{body}");
        return Ok(0);
    }
    let records: Vec<Record> = body
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    print!("{}", table(&records));
    Ok(0)
}

/// One row per line: when it ended, the device and forward, the client,
/// the bytes each way, how long, how it ended.
fn table(records: &[Record]) -> String {
    let mut out = format!(
        "{:<24} {:<28} {:<10} {:<32} {:>12} {:>12} {:>9}  {}\n",
        "ENDED-AT", "DEVICE", "FORWARD", "CLIENT", "TO-DEVICE", "TO-CLIENT", "MS", "HOW"
    );
    for r in records {
        let how = serde_json::to_value(r.ended)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        let lease = r
            .lease
            .as_deref()
            .map(|l| format!(" (lease {l})"))
            .unwrap_or_default();
        out.push_str(&format!(
            "{:<24} {:<28} {:<10} {:<32} {:>12} {:>12} {:>9}  {how}{lease}\n",
            r.time,
            r.device,
            r.forward,
            r.client,
            r.bytes_to_device,
            r.bytes_to_client,
            r.duration_ms
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_a_row_per_line_with_how_it_ended() {
        let r: Record = serde_json::from_str(
            r#"{"time":"2026-11-27T06:00:00.000Z","kind":"audit","device":"lab/device01-01",
            "forward":"http","protocol":"tcp","direction":"to-device","client":"ci/runner-1",
            "clientAddress":"10.244.1.5","bytesToDevice":10,"bytesToClient":20,"durationMs":5,
            "ended":"refused-by-lease","lease":"ci/hil-1"}"#,
        )
        .unwrap();
        let t = table(&[r]);
        let row = t.lines().nth(1).unwrap();
        assert!(
            row.contains("lab/device01-01") && row.contains("ci/runner-1"),
            "{t}"
        );
        assert!(row.ends_with("refused-by-lease (lease ci/hil-1)"), "{t}");
    }
}
