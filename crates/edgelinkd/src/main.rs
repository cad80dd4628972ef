//! `edgelinkd`, the edgelink node daemon. For every attachment recorded by
//! the plugin it opens the declared forwards inside the pod's network
//! namespace and relays them to the devices: TCP with splice(2), UDP with
//! batched syscalls. One process for the node; health, metrics, JSON status.

mod audit;
mod control;
mod daemon;
mod gate;
mod handover;
mod process;
mod status;

use anyhow::Context;
use daemon::Daemon;
use edgelink_status::http::{self as status_http, Scope};
use edgelinkd::config::{self, Command, RunArgs};
use edgelinkd::COMMIT;
use tokio::signal::unix::{signal, Signal, SignalKind};

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
        Command::Status(args) => rt.block_on(status::run(args)),
        Command::Audit(args) => rt.block_on(audit::run(args)),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("edgelinkd: {e:#}");
            std::process::exit(1);
        }
    }
}

async fn run(mut args: RunArgs) -> anyhow::Result<()> {
    process::init_logs(&args);
    process::raise_nofile_limit();
    // Everything is validated (clap) before anything is bound.
    process::prepare_state_dir(&args.state_dir)?;
    let instance = daemon::instance_id(&args.instance_id);
    args.instance_id = Some(instance.clone());
    // Caught from here on: a SIGTERM during a take-over stops this daemon
    // in order (below) instead of killing it with what it holds.
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;

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

    let (workers, died) = process::start_workers(&args)?;
    let mut settings = args.node_settings();
    if let Some(a) = args.audit_settings() {
        settings.audit = edgelink_access::Audit::start(a).context("the audit trail")?;
    }
    let node = edgelink_node::Node::new(settings, process::node_name(&args), workers.clone());
    process::replace_dead_workers(workers.clone(), node.clone(), died)?;
    let d = Daemon::new(args.clone(), node);
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
        None => (
            (
                control::bind(&d)?,
                status_listener.context("no status listener")?,
            ),
            control::SocketFile::of(&d.args.state_dir),
        ),
    };
    tokio::spawn(control::serve(control, d.clone()));
    open_status(&d, status_listener)?;
    tracing::info!(state_dir = %args.state_dir.display(), status_addr = %args.status_addr,
        node = %d.node.name, workers = workers.len(), "edgelinkd started");

    serve(&d, &mut term, &mut int).await?;
    d.stop().await;
    socket_file.remove_if_ours();
    workers.stop();
    Ok(())
}

/// Serve until SIGTERM or SIGINT: the heartbeat at once (the operator
/// takes a node whose heartbeats stop for --node-lost-after as lost, and a
/// first pass at 500 attachments takes a while), the reports once the
/// first pass has filed what this node serves.
async fn serve(
    d: &std::sync::Arc<Daemon>,
    term: &mut Signal,
    int: &mut Signal,
) -> anyhow::Result<()> {
    let reports = reports(d)?;
    if let Some((_, beat)) = &reports {
        edgelink_status::heartbeat::start(beat.clone());
    }
    d.first_pass().await;
    if let Some((hook, _)) = reports {
        edgelink_status::webhook::start(d.node.clone(), hook)?;
    }
    d.serve(term, int).await;
    Ok(())
}

/// The status surface: the status endpoint (on `listener`), the metrics
/// endpoint (`--metrics-addr`), the records watch.
fn open_status(
    d: &std::sync::Arc<Daemon>,
    listener: tokio::net::TcpListener,
) -> anyhow::Result<()> {
    let args = &d.args;
    tokio::spawn(status_http::serve(listener, d.endpoint(), Scope::Status));
    if let Some(addr) = args.metrics_addr {
        let l = status_http::bind_shared(addr).with_context(|| format!("--metrics-addr {addr}"))?;
        tokio::spawn(status_http::serve(l, d.endpoint(), Scope::Metrics));
    }
    edgelink_node::watch::start(d.node.clone()).context("watching the attachment records")?;
    Ok(())
}

/// The reports to edgelink-operator (the webhook) and their heartbeat,
/// checked (the URL, the token file): none without a webhook. A report
/// before the first pass says the node serves nothing, and the operator
/// takes the proxies out of their Services (what a take-over did on the
/// kube lab, check F6): the caller starts the webhook after it.
type Reports = (
    edgelink_status::webhook::Settings,
    edgelink_status::heartbeat::Settings,
);

fn reports(d: &std::sync::Arc<Daemon>) -> anyhow::Result<Option<Reports>> {
    let args = &d.args;
    use edgelink_status::webhook::{self, UrlSource};
    let url = match (&args.status_webhook, &args.status_webhook_file) {
        (Some(url), _) => UrlSource::Fixed(url.clone()),
        (None, Some(file)) => UrlSource::File(file.clone()),
        (None, None) => return Ok(None),
    };
    let hook = webhook::Settings {
        url: url.clone(),
        token_file: args.status_webhook_token_file.clone(),
        interval: args.status_webhook_interval,
    };
    webhook::check(&hook)?;
    let beat = edgelink_status::heartbeat::Settings {
        url,
        token_file: args.status_webhook_token_file.clone(),
        node: d.node.status().node,
        every: args.status_webhook_heartbeat,
        grants: d.node.grants.clone(),
        access: d.node.access.clone(),
        state_dir: args.state_dir.clone(),
    };
    Ok(Some((hook, beat)))
}

type Listeners = (tokio::net::UnixListener, tokio::net::TcpListener);

/// A take-over's last step: confirm (unless this daemon is being stopped
/// already: then everything goes back), and once the old daemon
/// acknowledged, file what arrived for the first pass and return the
/// control and status listeners to serve. `None`: aborted, exit.
async fn adopt_taken(
    d: &std::sync::Arc<Daemon>,
    t: handover::Taken,
    term: &mut Signal,
    int: &mut Signal,
) -> anyhow::Result<Option<(Listeners, control::SocketFile)>> {
    #[cfg(debug_assertions)]
    handover::test_stall(&d.args).await;
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
    let mut t = handover::confirm(t).await?;
    *d.taken_from.lock().unwrap_or_else(|e| e.into_inner()) = Some(t.from.clone());
    for (id, a) in std::mem::take(&mut t.adopted) {
        d.node.shared.lot.adopt(id, a);
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
