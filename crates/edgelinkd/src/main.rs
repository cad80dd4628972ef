//! `edgelinkd`, the edgelink node daemon. For every attachment recorded by
//! the plugin it opens the declared forwards inside the pod's network
//! namespace and relays them to the devices: TCP with splice(2), UDP with
//! batched syscalls. One process for the node; health, metrics, JSON status.

mod config;
mod control;
mod daemon;
mod delegate;
mod factory;
mod fds;
mod follow;
mod forward;
mod handover;
mod http;
mod kernel;
mod listen;
#[cfg(test)]
mod manifests;
mod metrics;
mod model;
mod parking;
mod private_side;
mod protect;
mod resume;
mod reverse;
mod sockopt;
mod status_cli;
mod takeover;
mod watch;
mod webhook;
mod workers;

use anyhow::Context;
use config::{Command, RunArgs};
use daemon::Daemon;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::time::Duration;

/// The commit this binary was built from (build.rs: `git rev-parse`, or
/// `EDGELINK_COMMIT` where the build has no .git; else "unknown").
pub const COMMIT: &str = env!("EDGELINK_COMMIT");
/// What `--version` prints after the name.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("EDGELINK_COMMIT"),
    ")"
);

/// sysexits' EX_USAGE: a bad flag or value.
const EX_USAGE: i32 = 64;

fn main() {
    let cli = match config::parse(std::env::args_os().collect()) {
        Ok(c) => c,
        Err(config::ParseError::Config(e)) => {
            eprintln!("edgelinkd: {e}");
            std::process::exit(EX_USAGE);
        }
        Err(config::ParseError::Clap(e)) => {
            let usage = !matches!(
                e.kind(),
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
            );
            let _ = e.print();
            std::process::exit(if usage { EX_USAGE } else { 0 });
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("edgelinkd")
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("edgelinkd: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    let result = match cli.command {
        Command::Run(args) => rt.block_on(run(args)).map(|()| 0),
        Command::Status(args) => rt.block_on(status_cli::run(args)),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("edgelinkd: {e:#}");
            std::process::exit(1);
        }
    }
}

fn node_name(args: &RunArgs) -> String {
    args.node_name
        .clone()
        .or_else(|| std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty()))
        .or_else(|| {
            nix::unistd::gethostname()
                .ok()
                .and_then(|h| h.into_string().ok())
        })
        .unwrap_or_default()
}

/// Raise the soft limit on open files to the hard limit. Each relayed
/// connection holds two sockets (and two pipe ends while bytes are in
/// flight), and service managers and container runtimes commonly start
/// processes with a soft limit of 1024: ~500 connections.
fn raise_nofile_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write `lim`, which we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0
        || lim.rlim_cur >= lim.rlim_max
    {
        return;
    }
    let soft = lim.rlim_cur;
    lim.rlim_cur = lim.rlim_max;
    // SAFETY: as above.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } == 0 {
        tracing::debug!(from = soft, to = lim.rlim_max, "raised the open-file limit");
    } else {
        tracing::warn!(limit = soft, error = %std::io::Error::last_os_error(), "cannot raise the open-file limit");
    }
}

async fn run(mut args: RunArgs) -> anyhow::Result<()> {
    let level: tracing::Level = args.log_level.parse().unwrap_or(tracing::Level::INFO);
    let logs = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_ansi(false);
    if args.log_format == "json" {
        logs.json().flatten_event(true).init();
    } else {
        logs.init();
    }

    raise_nofile_limit();
    // Everything is validated (clap) before anything is bound.
    let dir = &args.state_dir;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("state dir {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("state dir {}", dir.display()))?;
    let instance = daemon::instance_id(&args.instance_id);
    args.instance_id = Some(instance.clone());
    // Caught from here on: a SIGTERM during a take-over stops this daemon
    // in order (below) instead of killing it with what it holds.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;

    // --takeover: everything the running daemon serves, before anything is
    // bound here (its status and control listeners come along).
    let mut taken = None;
    if args.takeover {
        match handover::take(&args, &instance).await? {
            handover::Takeover::Fresh => {}
            handover::Takeover::Taken(t) => taken = Some(t),
            handover::Takeover::HandedOver(reason) => {
                // A container restarted after it handed over: serving
                // again would compete with its successor. Idle until
                // stopped (the successor's pod replaces this one).
                tracing::info!(%reason, "this instance handed over already: idle until stopped");
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
                return Ok(());
            }
        }
    }
    let status_listener = match &taken {
        Some(_) => None,
        None => Some(
            tokio::net::TcpListener::bind(args.status_addr)
                .await
                .with_context(|| format!("--status-addr {}", args.status_addr))?,
        ),
    };

    let node = node_name(&args);
    let (workers, mut died) =
        workers::Workers::start(args.workers).context("starting the worker threads")?;
    let d = Daemon::new(args.clone(), node, workers.clone());
    {
        let (d, workers) = (d.clone(), workers.clone());
        tokio::spawn(async move {
            while let Some(slot) = died.recv().await {
                match workers.replace(slot) {
                    Ok(generation) => {
                        tracing::error!(
                            worker = slot,
                            generation,
                            "a worker thread died: replaced, its listeners start again"
                        );
                        d.worker_died(slot);
                    }
                    Err(e) => {
                        tracing::error!(worker = slot, error = %e, "a worker thread died and cannot be replaced")
                    }
                }
            }
        });
    }
    // Debug builds only: SIGUSR2 kills worker 0 the way a bug would, for
    // the test that it is replaced.
    #[cfg(debug_assertions)]
    {
        let workers = workers.clone();
        let mut usr2 =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined2())?;
        tokio::spawn(async move {
            while usr2.recv().await.is_some() {
                workers.kill(0);
            }
        });
    }
    // Nothing that was handed over is served before the old daemon
    // acknowledged the Confirm: until then it may take everything back.
    let ((control, status_listener), socket_file) = match taken.take() {
        Some(t) => match adopt_taken(&d, t, &mut term, &mut int).await? {
            Some(listeners) => listeners,
            None => {
                workers.stop();
                return Ok(());
            }
        },
        None => {
            let control = control::bind(&d)?;
            let file = control::SocketFile::of(&d.args.state_dir);
            (
                (control, status_listener.context("no status listener")?),
                file,
            )
        }
    };
    tokio::spawn(control::serve(control, d.clone()));
    tokio::spawn(http::serve(status_listener, d.clone(), http::Scope::Status));
    if let Some(addr) = args.metrics_addr {
        let l = http::bind_shared(addr).with_context(|| format!("--metrics-addr {addr}"))?;
        tokio::spawn(http::serve(l, d.clone(), http::Scope::Metrics));
    }
    watch::start(d.clone()).context("watching the attachment records")?;
    let webhook = match (&args.status_webhook, &args.status_webhook_file) {
        (Some(url), _) => Some(webhook::Source::Fixed(url.clone())),
        (None, Some(file)) => Some(webhook::Source::File(file.clone())),
        (None, None) => None,
    };
    if let Some(source) = webhook {
        webhook::start(d.clone(), source)?;
    }
    tracing::info!(state_dir = %dir.display(), status_addr = %args.status_addr, node = %d.node, workers = workers.len(), "edgelinkd started");

    let mut first = true;
    loop {
        d.reconcile().await;
        if std::mem::take(&mut first) {
            for id in d.shared.lot.drop_unclaimed() {
                tracing::warn!(container = %id.0, ifname = %id.1, forward = %id.2,
                    "handed over, but no record serves it now: its connections are reset");
            }
        }
        tokio::select! {
            _ = d.nudge.notified() => {
                // Let a burst of record changes settle into one pass.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            _ = tokio::time::sleep(args.reconcile_interval) => {}
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
    }

    // A hand-over under way ends first: this process exits from it if it
    // succeeds; if it fails, what it took back is served again, to drain.
    if d.gate.stop().await {
        d.reconcile().await;
    }
    // Stop accepting, let connections drain for the grace period, exit.
    tracing::info!(grace = ?args.grace_period, "stopping: no new connections, draining");
    d.stop_listening();
    let deadline = tokio::time::Instant::now() + args.grace_period;
    while d.active() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let left = d.active();
    if left > 0 {
        tracing::warn!(
            connections = left,
            "grace period over: resetting what is left"
        );
        // Reset, not closed: bytes still in the pipes are lost, and a
        // clean end of file would pass a cut transfer off as whole.
        d.close_connections();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        while d.active() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // What nobody serves (a hand-over took it back and no record claims it
    // now) is reset: closed, it would end with a FIN as if it were whole.
    let reset = d.shared.lot.reset_all();
    if reset > 0 {
        tracing::warn!(
            connections = reset,
            "stopping: reset what was parked and not served"
        );
    }
    socket_file.remove_if_ours();
    workers.stop();
    Ok(())
}

type Listeners = (tokio::net::UnixListener, tokio::net::TcpListener);

/// A take-over's last step: confirm (unless this daemon is being stopped
/// already: then everything goes back), and once the old daemon
/// acknowledged, file what arrived for the first pass and return the
/// control and status listeners to serve. `None`: aborted, exit.
async fn adopt_taken(
    d: &std::sync::Arc<Daemon>,
    t: handover::Taken,
    term: &mut tokio::signal::unix::Signal,
    int: &mut tokio::signal::unix::Signal,
) -> anyhow::Result<Option<(Listeners, control::SocketFile)>> {
    #[cfg(debug_assertions)]
    takeover::test_stall(&d.args).await;
    let stopped = tokio::select! {
        biased;
        _ = term.recv() => true,
        _ = int.recv() => true,
        () = std::future::ready(()) => false,
    };
    if stopped {
        tracing::info!("stopped before the take-over was confirmed: everything goes back");
        t.abort("the new edgelinkd was stopped before it confirmed".into())
            .await;
        return Ok(None);
    }
    let mut t = t.confirm().await?;
    *d.taken_from.lock().unwrap_or_else(|e| e.into_inner()) = Some(t.from.clone());
    for (id, a) in std::mem::take(&mut t.adopted) {
        d.shared.lot.adopt(id, a);
    }
    let control = match t.control.take() {
        Some(l) => {
            l.set_nonblocking(true)?;
            tokio::net::UnixListener::from_std(l)?
        }
        None => control::bind(d)?,
    };
    let status = match t.status.take() {
        Some(l) => {
            l.set_nonblocking(true)?;
            tokio::net::TcpListener::from_std(l)?
        }
        None => tokio::net::TcpListener::bind(d.args.status_addr)
            .await
            .with_context(|| format!("--status-addr {}", d.args.status_addr))?,
    };
    Ok(Some((
        (control, status),
        control::SocketFile::of(&d.args.state_dir),
    )))
}
