//! What makes this a well-behaved node process: its logs, its open-file
//! limit, its state directory, its node name and its worker threads
//! (replaced when one dies).

use crate::config::RunArgs;
use anyhow::Context;
use edgelink_forward::workers::Workers;
use edgelink_node::Node;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;

/// Logs to stderr, as text or one JSON object per line (`--log-format`).
pub fn init_logs(args: &RunArgs) {
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
}

/// The state directory, made if need be, root's alone (0700).
pub fn prepare_state_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("state dir {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("state dir {}", dir.display()))
}

pub fn node_name(args: &RunArgs) -> String {
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
pub fn raise_nofile_limit() {
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

/// The worker threads. One that dies is replaced, and the listeners it
/// held start again on the node's next pass (`node`, once it exists).
pub fn start_workers(
    args: &RunArgs,
) -> anyhow::Result<(Arc<Workers>, tokio::sync::mpsc::UnboundedReceiver<usize>)> {
    Workers::start(args.workers).context("starting the worker threads")
}

/// Replace the workers that die, for as long as the process runs.
pub fn replace_dead_workers(
    workers: Arc<Workers>,
    node: Arc<Node>,
    mut died: tokio::sync::mpsc::UnboundedReceiver<usize>,
) -> anyhow::Result<()> {
    {
        let workers = workers.clone();
        tokio::spawn(async move {
            while let Some(slot) = died.recv().await {
                match workers.replace(slot) {
                    Ok(generation) => {
                        tracing::error!(
                            worker = slot,
                            generation,
                            "a worker thread died: replaced, its listeners start again"
                        );
                        node.worker_died(slot);
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
        let mut usr2 =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined2())?;
        tokio::spawn(async move {
            while usr2.recv().await.is_some() {
                workers.kill(0);
            }
        });
    }
    #[cfg(not(debug_assertions))]
    drop(workers);
    Ok(())
}
