//! The control socket `<stateDir>/edgelinkd.sock` (mode 0600): `rescan`
//! from the plugin after it wrote or removed a record, `check` from the
//! plugin's CHECK. The protocol lives in `edgelink_attachment::control`.

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
                _ => "error: expected `rescan` or `check <containerID> <ifname>`".to_string(),
            };
            let _ = w.write_all(format!("{answer}\n").as_bytes()).await;
        });
    }
}
