//! edgelinkd's side of a hand-over: [`give`] in the daemon that runs,
//! [`take`] in the one started with `--takeover`. The wire protocol, the
//! lot the tasks park in, and packing what they parked are
//! `edgelink_handover`'s; this module wires them to the daemon.
//!
//! The running daemon parks everything (its accept loops stop, its
//! connections stop between two syscalls, its UDP forwards stop reading),
//! sends a second descriptor of each socket and pipe with the inventory,
//! and waits for the new daemon's Confirm (`--handover-timeout` at most):
//! then it answers Ack and exits 0 without closing anything. Anything else
//! (a refusal, an error, no Confirm in time, the peer gone) and it says so,
//! takes its own parked state back and serves on. The new daemon serves
//! nothing before the Ack, so the two never serve the same sockets.
//!
//! One hand-over at a time, and none once the daemon is stopping: a
//! SIGTERM during a hand-over waits for its outcome (gate.rs).

use crate::daemon::Daemon;
use edgelink_handover::lot::Item;
use edgelink_handover::take::TakeError;
use edgelink_handover::{
    self as wire, blocking, peer, Channel, Message, Peer, RefusalCode, ACK, STEP,
};
use std::io::Write;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use edgelink_handover::take::{Taken, Takeover};

/// The tasks have this long to park.
const PARK_WITHIN: Duration = Duration::from_secs(10);

/// `--takeover`: ask the daemon running on this state directory for
/// everything it serves.
pub async fn take(args: &crate::config::RunArgs, instance: &str) -> anyhow::Result<Takeover> {
    let socket = args.state_dir.join(edgelink_attachment::DAEMON_SOCKET);
    edgelink_handover::take::take(&socket, args.handover_protocol, instance)
        .await
        .map_err(|e| anyhow::anyhow!("--takeover: {e}"))
}

/// The new daemon's Confirm, acknowledged (see [`Taken::confirm`]).
pub async fn confirm(t: Taken) -> anyhow::Result<Taken> {
    t.confirm()
        .await
        .map_err(|e: TakeError| anyhow::anyhow!("--takeover: {e}"))
}

/// Debug builds only, for the tests of a new daemon that is slow to
/// confirm: `--test-stall-confirm-ms`.
#[cfg(debug_assertions)]
pub async fn test_stall(args: &crate::config::RunArgs) {
    if let Some(ms) = args.test_stall_confirm_ms {
        tracing::warn!(ms, "test hook: stalling before the Confirm");
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}

// ---------------------------------------------------------------------
// The running daemon.

/// Hand everything over to the daemon that wrote `handover` on `stream`
/// (a control-socket connection; `control` is that socket's listener,
/// handed over too). Returns only if this daemon serves on.
pub async fn give(
    d: &Arc<Daemon>,
    stream: tokio::net::UnixStream,
    control: &tokio::net::UnixListener,
) {
    let started = Instant::now();
    let Some((hello, mut ch)) = greet(stream).await else {
        return;
    };
    if let Some((code, reason)) = refusal(d, &hello) {
        tracing::warn!(instance = %hello.instance, version = %hello.version, %reason, "hand-over refused: serving on");
        let _ = blocking(move || ch.send(&Message::Refused { reason, code })).await;
        return;
    }
    tracing::info!(to = %hello.instance, version = %hello.version, protocol = hello.protocol,
        "handing over: parking every forward");
    let pass = d.node.hold_passes().await;
    let lot = d.node.shared.lot.clone();
    let welcome = peer(hello.protocol, &d.instance);
    let sent = blocking(move || ch.send(&Message::Welcome(welcome)).map(|()| ch))
        .await
        .and_then(|r| r);
    let Ok(ch) = sent else {
        d.gate.served_on();
        return tracing::warn!("hand-over: the new daemon went away before parking: serving on");
    };

    lot.start_parking();
    let parked = lot.wait_parked(PARK_WITHIN).await;
    // With what a hand-over that failed took back and no pass has served
    // again yet.
    let items = lot.take_all();
    let outcome = if parked {
        hand(d, ch, &items, control, &hello, started).await
    } else {
        let reason = format!(
            "{} tasks did not park within {PARK_WITHIN:?}",
            lot.running()
        );
        refuse(ch, reason).await
    };
    if let Err(reason) = outcome {
        tracing::warn!(%reason, "hand-over failed: serving on");
    }
    take_back(d, items);
    drop(pass);
    d.gate.served_on();
    d.node.ask_pass();
}

/// The `handover` line answered, then the new daemon's Hello.
async fn greet(stream: tokio::net::UnixStream) -> Option<(Peer, Channel)> {
    let ch = async {
        let mut s = stream.into_std()?;
        s.set_nonblocking(false)?;
        s.set_write_timeout(Some(STEP))?;
        s.write_all(format!("{ACK}\n").as_bytes())?;
        Channel::new(s, STEP)
    };
    let mut ch = match ch.await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "hand-over: the connection failed");
            return None;
        }
    };
    let hello = blocking(move || ch.expect("Hello").map(|m| (m, ch)))
        .await
        .and_then(|r| r);
    match hello {
        Ok((Message::Hello(h), ch)) => Some((h, ch)),
        Ok((m, _)) => {
            tracing::warn!(got = m.name(), "hand-over: expected Hello");
            None
        }
        Err(e) => {
            tracing::warn!(error = %e, "hand-over: no Hello");
            None
        }
    }
}

/// Why this daemon will not hand over to `hello` (and the gate taken
/// when it will).
fn refusal(d: &Daemon, hello: &Peer) -> Option<(RefusalCode, String)> {
    let taken_from = d
        .taken_from
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    // `--handover-protocol` (tests): the newest this daemon speaks.
    let newest = d.args.handover_protocol;
    if !(wire::OLDEST_PROTOCOL..=newest).contains(&hello.protocol) {
        Some((
            RefusalCode::Protocol,
            format!(
                "edgelinkd {} speaks hand-over protocol {}, the new edgelinkd ({}) protocol {}",
                env!("CARGO_PKG_VERSION"),
                newest,
                hello.version,
                hello.protocol
            ),
        ))
    } else if taken_from.as_deref() == Some(hello.instance.as_str()) {
        Some((
            RefusalCode::HandedOver,
            format!(
                "instance {} handed everything to this daemon ({}): it does not take it back",
                hello.instance, d.instance
            ),
        ))
    } else if !d.gate.begin() {
        Some((
            RefusalCode::Busy,
            "this daemon is stopping or handing over already".into(),
        ))
    } else {
        None
    }
}

/// A failure after the Welcome: tell the new daemon; this one serves on.
async fn refuse(mut ch: Channel, reason: String) -> Result<(), String> {
    let refused = Message::Refused {
        reason: reason.clone(),
        code: RefusalCode::Failed,
    };
    let _ = blocking(move || ch.send(&refused)).await;
    Err(reason)
}

/// Everything parked: send it and wait for the Confirm. Exits the process
/// once the new daemon has it all; returns why not otherwise.
async fn hand(
    d: &Daemon,
    ch: Channel,
    items: &[Item],
    control: &tokio::net::UnixListener,
    hello: &Peer,
    started: Instant,
) -> Result<(), String> {
    let parked_in = started.elapsed();
    let (state, fds, counts) =
        match edgelink_handover::pack::pack(items, control.as_fd(), &d.instance, hello.protocol) {
            Ok(p) => p,
            Err(e) => return refuse(ch, format!("cannot list what to hand over: {e}")).await,
        };
    let n = fds.len() as u32;
    let wait = d.args.handover_timeout;
    let protocol = hello.protocol;
    let sent =
        blocking(move || edgelink_handover::give::send_and_commit(ch, state, fds, wait, protocol))
            .await
            .and_then(|r| r);
    if let Err(e) = sent {
        return Err(e.to_string());
    }
    tracing::info!(to = %hello.instance, descriptors = n, listeners = counts.listeners,
        connections = counts.connections, udp_sessions = counts.sessions,
        parked_ms = parked_in.as_millis() as u64, total_ms = started.elapsed().as_millis() as u64,
        "handed over: exiting");
    // Nothing is closed: the new daemon holds every socket now, and the
    // control socket's file is its.
    std::process::exit(0);
}

/// A hand-over failed: serve on with what was parked.
fn take_back(d: &Arc<Daemon>, items: Vec<Item>) {
    let lot = &d.node.shared.lot;
    lot.reopen();
    let (adopted, status) = Item::regroup(items);
    for (id, a) in adopted {
        lot.adopt(id, a);
    }
    if let Some(l) = status {
        let l = l
            .set_nonblocking(true)
            .and_then(|()| tokio::net::TcpListener::from_std(l));
        match l {
            Ok(l) => {
                tokio::spawn(edgelink_status::http::serve(
                    l,
                    d.endpoint(),
                    edgelink_status::http::Scope::Status,
                ));
            }
            Err(e) => tracing::error!(error = %e, "the status listener cannot be served again"),
        }
    }
    // Every relay forward starts again on the next pass, from the lot.
    d.node.listen_again("a hand-over failed: serving on");
}
