//! How a relayed connection ends: by itself, parked for a hand-over, or
//! reset because its attachment is gone (or its task was dropped); and
//! what is counted or handed on after it.

use crate::ctx::Ctx;
use crate::cutoff::Cutoff;
use crate::sockopt;
use edgelink_handover::lot::{Guard, Item, ParkedConn};
use edgelink_relay::{Counters, Relayed};
use std::os::fd::RawFd;

/// Resets both sockets of a relay that is dropped before it ended by
/// itself (its attachment stopped, the grace period of a SIGTERM ran out,
/// the task was aborted): the bytes still in its pipes are lost, and a
/// close(2) with a FIN would tell both peers the stream was whole.
///
/// Holds the raw descriptors, not the sockets (the relay owns those), so it
/// must be dropped before the relay and disarmed as soon as the relay ends
/// by itself (its sockets are closed then, and the numbers may be reused).
struct ResetUnlessDone {
    fds: [RawFd; 2],
    armed: bool,
}

impl ResetUnlessDone {
    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for ResetUnlessDone {
    fn drop(&mut self) {
        if self.armed {
            for fd in self.fds {
                // Fails only on a socket that is unusable anyway.
                let _ = sockopt::linger_zero(fd);
            }
        }
    }
}

/// After the relay: count how it ended, or park it; then let go of what
/// the connection `held` (its places under the caps), and its `guard`
/// last.
pub(crate) fn finish<H>(ctx: &Ctx, r: Option<Relayed>, held: H, guard: Guard) {
    let c = &ctx.forward.counters;
    match r {
        Some(Relayed::Ended(Ok(()))) => {}
        // Reset on both legs and counted in `idle_timeouts` by the relay.
        Some(Relayed::Ended(Err(e))) if e.kind() == std::io::ErrorKind::TimedOut => {
            tracing::debug!(error = %e, "connection idle for too long: reset");
        }
        Some(Relayed::Ended(Err(e))) => {
            Counters::inc(&c.errors);
            tracing::debug!(error = %e, "connection ended with an error");
        }
        Some(Relayed::Parked(p)) => {
            ctx.shared
                .lot
                .park(Item::Conn(ctx.id(), ParkedConn::Relaying(p)));
        }
        None => tracing::debug!("attachment stopped: connection reset"),
    }
    // The guard last: a hand-over waits for it, and the item is in the lot.
    drop(held);
    drop(guard);
}

/// Run a relay until it ends or parks (`Some`), or until the attachment
/// is gone (`None`: DEL, netns gone, record changed, or the grace period
/// of a SIGTERM is over), and its connections end with it, so that
/// nothing keeps the pod's namespace alive. The relay's token is cancelled
/// then, as for a hand-over ([`Cutoff`]): it parks, and what it parked is
/// reset here. Dropped (the task aborted), both sockets (`fds`) are reset.
/// Either way, bytes in flight are lost.
///
/// `run` is pinned where the caller keeps it: a future taken by value and
/// pinned here would be held twice in this one's state (the argument and
/// the pinned local), 3 KiB more in every connection's task. The caller
/// declares it before calling, so this future, and the reset in it, is
/// dropped first, while `run`'s sockets are still open.
pub(crate) async fn relay<F: std::future::Future<Output = Relayed>>(
    run: std::pin::Pin<&mut F>,
    fds: [RawFd; 2],
    cutoff: &Cutoff,
) -> Option<Relayed> {
    let mut reset = ResetUnlessDone { fds, armed: true };
    let r = run.await;
    // Ended by itself (its sockets are closed, reset already on an error)
    // or parked (they are handed on): the descriptors must not be touched
    // again.
    reset.disarm();
    match r {
        Relayed::Parked(p) if cutoff.is_closed() => {
            ParkedConn::Relaying(p).reset();
            None
        }
        r => Some(r),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgelink_relay::{PipePool, TcpRelayConfig};
    use std::os::fd::AsRawFd;
    use std::sync::Arc;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    /// A connected pair over loopback: (the relay's end, the peer's end).
    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let peer = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (ours, _) = l.accept().await.unwrap();
        (ours, peer)
    }

    /// How a read on `s` ends: `Ok(bytes)` at end of file, or the error.
    async fn read_end(s: &mut TcpStream) -> std::io::Result<usize> {
        let mut buf = vec![0u8; 1 << 16];
        let mut n = 0;
        loop {
            match tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await {
                Ok(Ok(0)) => return Ok(n),
                Ok(Ok(k)) => n += k,
                Ok(Err(e)) => return Err(e),
                Err(_) => panic!("no end within 10 s"),
            }
        }
    }

    /// [`relay`] of a fresh relay, with its token from `cutoff` (the
    /// lot's is never cancelled).
    async fn run_relay(
        client: TcpStream,
        upstream: TcpStream,
        pipes: &PipePool,
        counters: &Counters,
        cfg: &TcpRelayConfig,
        cutoff: &Cutoff,
    ) -> Option<Relayed> {
        let fds = [client.as_raw_fd(), upstream.as_raw_fd()];
        let park = cutoff.token(&edgelink_handover::lot::Lot::default());
        let run = std::pin::pin!(edgelink_relay::relay_tcp(
            client, upstream, pipes, counters, cfg, &park, None
        ));
        relay(run, fds, cutoff).await
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn a_relay_aborted_or_closed_resets_both_peers() {
        runtime().block_on(async {
            let pipes = PipePool::new(1 << 16, 4);
            let cfg = TcpRelayConfig::default();
            for abort in [true, false] {
                let (client, mut client_peer) = pair().await;
                let (upstream, mut upstream_peer) = pair().await;
                let cutoff = Arc::new(Cutoff::default());
                let (p, c, cut) = (pipes.clone(), cfg.clone(), cutoff.clone());
                let task = tokio::spawn(async move {
                    let counters = Counters::default();
                    run_relay(client, upstream, &p, &counters, &c, &cut).await
                });
                // Bytes in flight, and proof that the relay runs.
                upstream_peer.write_all(b"partial").await.unwrap();
                let mut got = [0u8; 7];
                client_peer.read_exact(&mut got).await.unwrap();
                if abort {
                    task.abort();
                    assert!(task.await.unwrap_err().is_cancelled());
                } else {
                    cutoff.close();
                    assert!(task.await.unwrap().is_none());
                }
                for peer in [&mut client_peer, &mut upstream_peer] {
                    let end = read_end(peer).await;
                    assert_eq!(
                        end.as_ref().map_err(std::io::Error::kind).err(),
                        Some(std::io::ErrorKind::ConnectionReset),
                        "abort={abort}: {end:?}"
                    );
                }
            }
        });
    }

    /// What an idle relayed connection's task holds beside its sockets:
    /// the relay's future and `relay`'s around it (docs/benchmarks.md,
    /// "Issue 25, an idle connection"); the bound catches a wait or a copy
    /// coming back.
    #[test]
    fn an_idle_connections_relay_futures_stay_small() {
        runtime().block_on(async {
            let pipes = PipePool::new(1 << 16, 4);
            let (cfg, counters) = (TcpRelayConfig::default(), Counters::default());
            let park = tokio_util::sync::CancellationToken::new();
            let (client, _client_peer) = pair().await;
            let (upstream, _upstream_peer) = pair().await;
            let cutoff = Cutoff::default();
            let fds = [client.as_raw_fd(), upstream.as_raw_fd()];
            let mut run = std::pin::pin!(edgelink_relay::relay_tcp(
                client, upstream, &pipes, &counters, &cfg, &park, None
            ));
            let run_size = std::mem::size_of_val(&*run);
            let outer = std::mem::size_of_val(&relay(run.as_mut(), fds, &cutoff));
            // 520 in a release build, 536 in a debug one (rustc 1.95): the
            // directions live in a box only while bytes move
            // (edgelink-relay's tcp/doze.rs), 2736 when they stayed; 712
            // while `relay` waited on the attachment's close beside the
            // relay's token (cutoff.rs).
            let bound = 600;
            eprintln!("relay_tcp {run_size} bytes, relay {outer} bytes (bound {bound})");
            assert!(
                run_size + outer <= bound,
                "an idle connection's futures: relay_tcp {run_size} + relay {outer} bytes, over {bound}"
            );
            assert!(outer <= 128, "relay holds a copy of the relay's future, or a wait: {outer} bytes");
        });
    }

    #[test]
    fn a_relay_that_ends_by_itself_ends_cleanly() {
        runtime().block_on(async {
            let pipes = PipePool::new(1 << 16, 4);
            let (client, mut client_peer) = pair().await;
            let (upstream, mut upstream_peer) = pair().await;
            let p = pipes.clone();
            let task = tokio::spawn(async move {
                let counters = Counters::default();
                run_relay(
                    client,
                    upstream,
                    &p,
                    &counters,
                    &TcpRelayConfig::default(),
                    &Cutoff::default(),
                )
                .await
            });
            upstream_peer.write_all(b"whole").await.unwrap();
            upstream_peer.shutdown().await.unwrap();
            assert_eq!(read_end(&mut client_peer).await.unwrap(), 5);
            client_peer.shutdown().await.unwrap();
            assert_eq!(read_end(&mut upstream_peer).await.unwrap(), 0);
            assert!(matches!(task.await.unwrap(), Some(Relayed::Ended(Ok(())))));
        });
    }
}
