//! The control socket `<stateDir>/edgelinkd.sock` (mode 0600): `rescan`
//! from the plugin after it wrote or removed a record, `check` from the
//! plugin's CHECK, `reap` from its DEL. The protocol lives in
//! `edgelink_attachment::control`.

use crate::daemon::Daemon;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;

/// Bind the socket (replacing a stale one from an earlier run).
pub fn bind(d: &Daemon) -> anyhow::Result<UnixListener> {
    let path = d.args.state_dir.join(edgelink_attachment::DAEMON_SOCKET);
    let _ = std::fs::remove_file(&path);
    let l = UnixListener::bind(&path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    Ok(l)
}

pub async fn serve(l: UnixListener, d: Arc<Daemon>) {
    loop {
        let Ok((stream, _)) = l.accept().await else {
            continue;
        };
        let d = d.clone();
        tokio::spawn(async move {
            let (r, mut w) = stream.into_split();
            let mut line = String::new();
            let read = tokio::time::timeout(
                std::time::Duration::from_secs(2),
                BufReader::new(r).read_line(&mut line),
            )
            .await;
            if !matches!(read, Ok(Ok(_))) {
                return;
            }
            if let Some(rest) = line.strip_prefix("reap ") {
                let answer = reap(&d, rest.trim_end_matches('\n'));
                let _ = w.write_all(format!("{answer}\n").as_bytes()).await;
                return;
            }
            let mut words = line.split_whitespace();
            let answer = match (words.next(), words.next(), words.next()) {
                (Some("rescan"), None, None) => {
                    d.nudge.notify_one();
                    "ok".to_string()
                }
                (Some("check"), Some(cid), Some(ifname)) => {
                    let mut r = d.check(cid, ifname);
                    if !r.found {
                        // The record may be newer than the last pass.
                        d.reconcile().await;
                        r = d.check(cid, ifname);
                    }
                    serde_json::to_string(&r).unwrap_or_default()
                }
                _ => "error: expected `rescan`, `check <containerID> <ifname>` or `reap <name> <netns>`"
                    .to_string(),
            };
            let _ = w.write_all(format!("{answer}\n").as_bytes()).await;
        });
    }
}

/// `reap <name> <netns path>`: delete a link the plugin's DEL retired, in
/// the background (the kernel takes tens of milliseconds; the plugin does
/// not wait). Only retired names are accepted.
fn reap(d: &Arc<Daemon>, args: &str) -> String {
    let Some((name, netns)) = args.split_once(' ') else {
        return "error: expected `reap <name> <netns>`".into();
    };
    if !edgelink_attachment::is_retired_ifname(name) {
        return format!("error: {name:?} is not a retired interface's name");
    }
    if !netns.starts_with('/') {
        return format!("error: {netns:?} is not an absolute path");
    }
    let (name, netns) = (name.to_string(), std::path::PathBuf::from(netns));
    let d = d.clone();
    tokio::task::spawn_blocking(move || {
        let deleted = edgelink_netns::Netns::open(&netns).map(|ns| {
            ns.run(|| edgelink_netlink::Handle::new().and_then(|mut h| h.del_link_by_name(&name)))
        });
        match deleted {
            Ok(Ok(Ok(_))) => {
                d.reaped.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::debug!(%name, netns = %netns.display(), "retired link deleted")
            }
            // Gone with its namespace.
            Err(edgelink_netns::NetnsError::NotFound { .. }) => {}
            Ok(Ok(Err(e))) => {
                tracing::warn!(%name, netns = %netns.display(), error = %e, "cannot delete a retired link")
            }
            Ok(Err(e)) | Err(e) => {
                tracing::warn!(%name, netns = %netns.display(), error = %e, "cannot enter the namespace of a retired link")
            }
        }
    });
    "ok".into()
}
