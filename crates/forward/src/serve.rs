//! Starting one forward: checks the record again (allowedTargets, a
//! reverse target in the segment), takes what a hand-over brought or binds
//! new sockets, and starts the accept loops (TCP, [`crate::listen`]), the
//! UDP relay ([`crate::udp`]), the name a reverse target follows
//! ([`crate::follow`]) and the probe ([`crate::probe`]).

use crate::ctx::Ctx;
use crate::listen::Sock;
use edgelink_attachment::{ForwardPath, Protocol};
use edgelink_handover::lot::{Adopted, ParkedConn};
use tokio::task::JoinHandle;

/// Start serving; returns the tasks to abort when the attachment goes.
pub async fn start(ctx: Ctx) -> Vec<JoinHandle<()>> {
    let f = ctx.forward.clone();
    let spec = &f.spec;
    let probe = ctx.reachability_probe
        && spec.protocol == Protocol::Tcp
        && !ctx.shared.settings.probe_interval.is_zero();
    if spec.path == ForwardPath::Kernel {
        // Its table is the attachment's (edgelink-node's kernel module);
        // only the probe that keeps its reachability fresh runs here.
        if probe {
            return vec![tokio::spawn(crate::probe::run(ctx.clone_for()))];
        }
        return Vec::new();
    }
    if refused(&ctx) {
        return Vec::new();
    }
    let stream = spec.protocol == Protocol::Tcp;
    // TCP: one listener per address, accepted on by every worker
    // (crate::listen). UDP: one socket on one worker (the forwards spread
    // by port), so that its session table, and the `--udp-max-sessions`
    // bound on it, stay whole.
    let workers = &ctx.shared.workers;
    let on: Vec<usize> = if stream {
        (0..workers.len()).collect()
    } else {
        vec![workers.for_udp(spec.port)]
    };
    if let Some(m) = crate::modbus::mux_of(&ctx) {
        let _ = ctx.modbus.set(m);
    }
    let Some(socks) = sockets(&ctx, &on).await else {
        return Vec::new();
    };
    let mut tasks = Vec::new();
    for sock in socks {
        match sock {
            Sock::Tcp(std) => match crate::listen::serve_tcp(&ctx, &on, std) {
                Some(t) => tasks.extend(t),
                None => {
                    tasks.iter().for_each(JoinHandle::abort);
                    return Vec::new();
                }
            },
            Sock::Udp(forward) => tasks.push(crate::udp::spawn(&ctx, on[0], forward)),
        }
    }
    f.set_listener("listening");
    if let Some(r) = f.reverse.clone().filter(|r| r.spec.target.addr().is_none()) {
        tasks.push(tokio::spawn(crate::follow::run(
            r,
            ctx.factory.clone(),
            ctx.stop.clone(),
        )));
    }
    if probe {
        tasks.push(tokio::spawn(crate::probe::run(ctx.clone_for())));
    }
    tasks
}

/// The record is a file on disk: what the plugin checked is checked
/// again. A reverse forward's target must not be in the segment (a loop);
/// a forward's must be inside allowedTargets. True (and the forward marked
/// `refused`) when it is not served.
fn refused(ctx: &Ctx) -> bool {
    let f = &ctx.forward;
    let spec = &f.spec;
    if let Some(r) = &f.reverse {
        let looped = r
            .spec
            .target
            .addr()
            .and_then(|a| r.in_segment(a.ip()).map(|n| (a, n)));
        if let Some((a, n)) = looped {
            f.set_listener("refused");
            f.error(format!(
                "target {a} is inside the interface's subnet {n}: a loop"
            ));
            tracing::warn!(forward = %spec.name, target = %a, "reverse target in the segment: not serving");
            return true;
        }
    } else if !spec.target_allowed(&ctx.allowed) {
        f.set_listener("refused");
        f.error(format!(
            "target {} is outside allowedTargets {:?}",
            spec.target, ctx.allowed
        ));
        tracing::warn!(forward = %spec.name, target = %spec.target, "target outside allowedTargets: not serving");
        return true;
    }
    false
}

/// The forward's sockets: what a hand-over brought (another daemon's, or
/// ours after a hand-over that failed), as they are, else new ones. Its
/// handed-over connections are resumed on the workers `on` before the
/// accept loops start (new clients queue behind them). `None`: binding
/// failed (retried on the next pass).
async fn sockets(ctx: &Ctx, on: &[usize]) -> Option<Vec<Sock>> {
    let spec = &ctx.forward.spec;
    let stream = spec.protocol == Protocol::Tcp;
    let adopted = ctx
        .shared
        .lot
        .claim(&ctx.id())
        .filter(|a| adopted_fits(a, spec.port, stream));
    let Some(mut a) = adopted else {
        return crate::listen::bind(ctx).await;
    };
    tracing::info!(forward = %spec.name, listeners = a.listeners.len() + a.udp.len(),
        connections = a.conns.len(), sessions = a.udp.iter().map(|u| u.sessions.len()).sum::<usize>(),
        "serving what was handed over");
    // A daemon before this one's made a listener per worker with
    // SO_REUSEPORT, that a root process of the pod could join: closed and
    // bound anew (the clients in their accept queues are reset, once); the
    // connections go on.
    let rebind = a.listeners.iter().any(crate::listen::joinable);
    let listeners = std::mem::take(&mut a.listeners);
    let mut socks: Vec<Sock> = Vec::new();
    if rebind {
        tracing::warn!(forward = %spec.name, "handed-over listeners have SO_REUSEPORT: bound anew");
        drop(listeners);
    } else {
        socks.extend(listeners.into_iter().map(Sock::Tcp));
    }
    a.udp.iter().for_each(crate::listen::seal_udp);
    socks.extend(a.udp.into_iter().map(Sock::Udp));
    crate::resume::spawn(ctx, a.conns, on);
    if rebind {
        socks.extend(crate::listen::bind_when_free(ctx).await?);
    }
    Some(socks)
}

/// Whether handed-over sockets are this forward's: listeners of its
/// protocol on its port. (A record that changed between the two daemons
/// makes new ones; the old ones are dropped with what no forward claims.)
fn adopted_fits(a: &Adopted, port: u16, stream: bool) -> bool {
    let tcp_ok = a
        .listeners
        .iter()
        .all(|l| l.local_addr().is_ok_and(|x| x.port() == port));
    let udp_ok = a
        .udp
        .iter()
        .all(|u| u.listener.local_addr().is_ok_and(|x| x.port() == port));
    let has = if stream {
        !a.listeners.is_empty() && a.udp.is_empty()
    } else {
        !a.udp.is_empty() && a.listeners.is_empty() && a.conns.is_empty()
    };
    if !(has && tcp_ok && udp_ok) {
        if !a.is_empty() {
            tracing::warn!(
                port,
                "handed-over sockets do not fit the forward's record: new ones are made"
            );
            drop_adopted(a);
        }
        return false;
    }
    true
}

fn drop_adopted(a: &Adopted) {
    a.conns.iter().for_each(ParkedConn::reset);
}
