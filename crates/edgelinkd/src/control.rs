//! The control socket `<stateDir>/edgelinkd.sock` (mode 0600): `rescan`
//! (of one record) from the plugin after it wrote or removed it, `check` from the
//! plugin's CHECK, `reap` from its DEL. The protocol lives in
//! `edgelink_attachment::control`.

use crate::daemon::Daemon;
use edgelink_attachment::Request;
use edgelink_fd_reserve::{self as fds, Lease};
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

/// The control socket's path as this daemon found it once it held the
/// socket (bound or taken over): removed at exit only if it is still that
/// file. Another daemon may have bound the path since (one started afresh
/// beside this one); a daemon that handed its socket over exits without
/// getting here.
pub struct SocketFile {
    path: std::path::PathBuf,
    id: Option<(u64, u64)>,
}

impl SocketFile {
    pub fn of(state_dir: &std::path::Path) -> SocketFile {
        let path = state_dir.join(edgelink_attachment::DAEMON_SOCKET);
        let id = file_id(&path);
        SocketFile { path, id }
    }

    pub fn remove_if_ours(&self) {
        match (self.id, file_id(&self.path)) {
            (Some(ours), Some(now)) if ours == now => {
                let _ = std::fs::remove_file(&self.path);
            }
            (_, None) => {}
            _ => tracing::info!(socket = %self.path.display(),
                "the control socket's path is another daemon's now: left in place"),
        }
    }
}

fn file_id(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

pub async fn serve(l: UnixListener, d: Arc<Daemon>) {
    // A connection that asked for a hand-over comes back here: the
    // hand-over runs in this loop, which accepts nothing meanwhile (the
    // listener goes with it), and returns only if it failed.
    let (handover_tx, mut handover_rx) = tokio::sync::mpsc::channel::<tokio::net::UnixStream>(1);
    loop {
        let accepted = tokio::select! {
            Some(stream) = handover_rx.recv() => {
                crate::handover::give(&d, stream, &l).await;
                continue;
            }
            r = l.accept() => r,
        };
        let (stream, lease) = match accepted {
            Ok((s, _)) => (s, None),
            Err(e) => match accept_at_limit(&l, &d, e).await {
                Some(accepted) => accepted,
                None => continue,
            },
        };
        let d = d.clone();
        let handover = handover_tx.clone();
        tokio::spawn(async move {
            // The reserve (if this request needed it) is taken back once
            // the request is answered: `reap` opens a netns and a netlink
            // socket.
            let _lease = lease;
            let (r, mut w) = stream.into_split();
            let mut line = String::new();
            let mut reader = BufReader::new(r);
            let read = tokio::time::timeout(
                std::time::Duration::from_secs(2),
                reader.read_line(&mut line),
            )
            .await;
            if !matches!(read, Ok(Ok(_))) {
                return;
            }
            if line.trim_end() == edgelink_handover::HANDOVER_LINE {
                // The peer waits for our answer before its first frame:
                // nothing of it is in the reader's buffer.
                if let Ok(stream) = reader.into_inner().reunite(w) {
                    let _ = handover.send(stream).await;
                }
                return;
            }
            let answer = match Request::parse(&line) {
                Ok(Request::Rescan) => {
                    d.node.ask_pass();
                    "ok".to_string()
                }
                Ok(Request::RescanRecord {
                    container_id,
                    ifname,
                }) => {
                    d.node.ask_record(&container_id, &ifname);
                    "ok".to_string()
                }
                Ok(Request::Check {
                    container_id,
                    ifname,
                }) => {
                    let mut r = d.node.check(&container_id, &ifname);
                    if !r.found {
                        // The record may be newer than the last pass.
                        d.node.reconcile().await;
                        r = d.node.check(&container_id, &ifname);
                    }
                    serde_json::to_string(&r).unwrap_or_default()
                }
                Ok(Request::Reap { index, name, netns }) => d.node.reap(index, name, netns).await,
                Err(e) => format!("error: {e}"),
            };
            let _ = w.write_all(format!("{answer}\n").as_bytes()).await;
        });
    }
}

/// After a failed accept: at the open-file limit, accept with the fds kept
/// for this socket ([`edgelink_fd_reserve`]); else (or when they are lent out
/// already) back off a little rather than spin, as the forwards do.
async fn accept_at_limit(
    l: &UnixListener,
    d: &Daemon,
    e: std::io::Error,
) -> Option<(tokio::net::UnixStream, Option<Lease>)> {
    if fds::exhausted(&e) {
        if let Some(lease) = d.node.shared.fds.lease() {
            // accept(2) takes the descriptor before it looks at the queue:
            // EMFILE does not mean a connection waits. Never hold the
            // reserve while waiting for one.
            match fds::accept_now(l.accept()).await {
                Some(Ok((s, _))) => return Some((s, Some(lease))),
                Some(Err(e)) => tracing::warn!(error = %e, "control socket: accept failed"),
                None => {}
            }
        }
    } else {
        tracing::warn!(error = %e, "control socket: accept failed");
    }
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    None
}
