//! Deleting the pod interfaces the plugin's DEL retired (down, renamed,
//! marked): the control socket's `reap` request.

use crate::node::Node;
use edgelink_fd_reserve::{self as fds, FdReserve, Lease};
use edgelink_netns::{Netns, NetnsError};
use std::path::Path;
use std::sync::Arc;

/// Open a netns for a control request. A request accepted without the fd
/// reserve (a descriptor happened to be free) may find none left for the
/// netns: then it takes the reserve ([`FdReserve::lease`]), which pauses
/// the forwards and UDP sessions, and tries again (for a second at most,
/// should a socket being made at that moment hold what was freed).
fn open_netns(path: &Path, fds: &Arc<FdReserve>) -> Result<(Netns, Option<Lease>), NetnsError> {
    let mut lease = None;
    for _ in 0..40 {
        match Netns::open(path) {
            Err(NetnsError::Open { source, .. }) if fds::exhausted(&source) => {
                if lease.is_none() {
                    lease = fds.lease();
                }
                std::thread::sleep(std::time::Duration::from_millis(25));
            }
            r => return r.map(|ns| (ns, lease)),
        }
    }
    Netns::open(path).map(|ns| (ns, lease))
}

impl Node {
    /// `reap <ifindex> <name> <netns path>`: delete a link the plugin's DEL
    /// retired. Answers once the link is found and checked (its name, and the
    /// retired alias, so that nothing else is ever deleted); the deletion itself
    /// (tens of milliseconds in the kernel) goes on in the background.
    pub async fn reap(self: &Arc<Self>, index: u32, name: String, netns: String) -> String {
        let netns = std::path::PathBuf::from(netns);
        let (tx, rx) = tokio::sync::oneshot::channel::<String>();
        let d = self.clone();
        tokio::task::spawn_blocking(move || {
            // Kept until the link is checked and deleted (a netlink socket).
            let (ns, _lease) = match open_netns(&netns, &d.shared.fds) {
                Ok(ns) => ns,
                Err(e) => {
                    let _ = tx.send(format!("error: {e}"));
                    return;
                }
            };
            let deleted = ns.run(|| -> Result<(), String> {
                let checked = (|| -> Result<edgelink_netlink::Handle, String> {
                    let mut h = edgelink_netlink::Handle::new().map_err(|e| e.to_string())?;
                    match h.link_by_index(index).map_err(|e| e.to_string())? {
                        Some(l)
                            if l.name == name
                                && l.alias.as_deref()
                                    == Some(edgelink_attachment::RETIRED_ALIAS) =>
                        {
                            Ok(h)
                        }
                        Some(_) => {
                            Err(format!("link #{index} is not a retired link called {name}"))
                        }
                        None => Err(format!("no link #{index}")),
                    }
                })();
                match checked {
                    Ok(mut h) => {
                        let _ = tx.send("ok".into());
                        h.del_link(index).map(|_| ()).map_err(|e| e.to_string())
                    }
                    Err(e) => {
                        let _ = tx.send(format!("error: {e}"));
                        Err(e)
                    }
                }
            });
            match deleted {
                Ok(Ok(())) => {
                    d.reaped.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tracing::debug!(%name, netns = %netns.display(), "retired link deleted");
                }
                Ok(Err(e)) => {
                    tracing::warn!(%name, netns = %netns.display(), error = %e, "retired link not deleted")
                }
                Err(e) => {
                    tracing::warn!(%name, netns = %netns.display(), error = %e, "cannot enter the namespace of a retired link")
                }
            }
        });
        // Dropped without an answer (the closure ended early): the error was
        // sent; a closure that panicked says nothing.
        rx.await
            .unwrap_or_else(|_| "error: the link was not checked".into())
    }
}
