//! `edgelinkd status`: ask a running daemon for its /status and print it
//! (edgelink-status renders the table and judges what is well).

use crate::config::StatusArgs;
use edgelink_status::table::{table, unwell, Filter, EXIT_UNWELL};
use edgelink_status::Status;

/// Print the status; the exit status: 0, or [`EXIT_UNWELL`].
pub async fn run(args: StatusArgs) -> anyhow::Result<i32> {
    let (code, body) = edgelink_status::http::get(args.status_addr, "/status")
        .await
        .map_err(|e| anyhow::anyhow!("cannot reach edgelinkd at {}: {e}", args.status_addr))?;
    if code != 200 {
        anyhow::bail!("edgelinkd at {} answered {code}: {body}", args.status_addr);
    }
    let filter = Filter {
        namespace: args.namespace,
        pod: args.pod,
        forward: args.forward,
    };
    let s = filter.apply(&serde_json::from_str::<Status>(&body)?);
    let bad = unwell(&s);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        print!("{}", table(&s));
        for b in &bad {
            println!("NOT WELL: {b}");
        }
    }
    Ok(if bad.is_empty() { 0 } else { EXIT_UNWELL })
}
