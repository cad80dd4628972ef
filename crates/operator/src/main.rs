//! edgelink-operator: Device and EdgeNetwork custom resources make each
//! device's NetworkAttachmentDefinition, proxy pod and Service, and the
//! Device's status shows its health as edgelinkd reports it.
//!
//!   edgelink-operator run [--listen 0.0.0.0:8080] [--webhook-audience A] ...
//!   edgelink-operator crds            the CRDs as YAML (daemonset/operator/crds.yaml)
//!   edgelink-operator crds --without-cel   without CEL rules (daemonset/operator/crds-1.20.yaml)
//!
//! docs/operator.md: install, the resources, status.

mod run;

use anyhow::Context;
use clap::{Parser, Subcommand};
use edgelink_operator::render::ProxyPodSettings;
use run::context::Ctx;
use run::leader::Election;
use run::metrics::Metrics;
use run::reports::Reports;
use run::server::App;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const MANAGER: &str = edgelink_operator::render::MANAGER;
/// The Lease's own field manager (kube-lease-manager applies it).
pub const MANAGER_LEASE: &str = "edgelink-operator-lease";

#[derive(Parser)]
#[command(
    name = "edgelink-operator",
    version,
    about = "Devices as custom resources: NAD, proxy pod and Service per device, and device health"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the controller (in-cluster config, else $KUBECONFIG or ~/.kube/config).
    Run(Box<RunArgs>),
    /// Print the CustomResourceDefinitions (YAML): with CEL rules, for
    /// Kubernetes 1.31 and later (daemonset/operator/crds.yaml).
    Crds {
        /// Without the CEL rules, for Kubernetes 1.20 to 1.30
        /// (daemonset/operator/crds-1.20.yaml).
        #[arg(long)]
        without_cel: bool,
    },
}

fn secs(s: &str) -> Result<Duration, String> {
    match s.parse::<u64>() {
        Ok(v) if (1..=86400).contains(&v) => Ok(Duration::from_secs(v)),
        _ => Err(format!("{s:?} is not a number of seconds in 1..=86400")),
    }
}

/// Seconds, fractions allowed (`1.5`), 0.2 to 3600.
fn bound(s: &str) -> Result<Duration, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.2..=3600.0).contains(&v) => Ok(Duration::from_secs_f64(v)),
        _ => Err(format!("{s:?} is not a number of seconds in 0.2..=3600")),
    }
}

/// `KEY=VALUE`, or empty for none.
fn label(s: &str) -> Option<(String, String)> {
    let (k, v) = s.split_once('=')?;
    Some((k.to_string(), v.to_string())).filter(|_| !k.is_empty())
}

fn label_arg(s: &str) -> Result<String, String> {
    if s.is_empty() || label(s).is_some() {
        Ok(s.to_string())
    } else {
        Err(format!("{s:?} is not KEY=VALUE (or empty: none)"))
    }
}

/// A DNS name (`cluster.local`).
fn domain_arg(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-')
        });
    if ok {
        Ok(s.trim_end_matches('.').to_string())
    } else {
        Err(format!("{s:?} is not a DNS domain"))
    }
}

/// `NAMESPACE:NAME` of a ServiceAccount.
fn service_account_arg(s: &str) -> Result<String, String> {
    match s.split_once(':') {
        Some((ns, name))
            if !ns.is_empty()
                && !name.is_empty()
                && domain_arg(ns).is_ok()
                && domain_arg(name).is_ok() =>
        {
            Ok(s.to_string())
        }
        _ => Err(format!("{s:?} is not NAMESPACE:NAME of a ServiceAccount")),
    }
}

#[derive(Parser)]
struct RunArgs {
    /// /healthz, /readyz, /metrics and the webhook (POST /v1/status).
    #[arg(long, default_value = "0.0.0.0:8080")]
    listen: SocketAddr,
    /// The namespace of the Lease and of the webhook Service.
    #[arg(long, env = "POD_NAMESPACE", default_value = "edgelink-system")]
    namespace: String,
    /// This replica's name in the Lease (the pod's name).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// This replica's address, for the webhook Service's Endpoints.
    #[arg(long, env = "POD_IP")]
    pod_ip: Option<IpAddr>,
    /// The Lease of the leader election.
    #[arg(long, default_value = "edgelink-operator")]
    lease: String,
    /// A Service without selector whose Endpoints the leader points at
    /// itself, for edgelinkd's reports (empty: leave Endpoints alone).
    #[arg(long, default_value = "edgelink-operator-webhook")]
    webhook_service: String,
    /// Reports must carry a ServiceAccount token projected for this audience
    /// (edgelinkd's, bound to its pod: the report's node must be the pod's).
    #[arg(long, default_value = "edgelink-operator")]
    webhook_audience: String,
    /// edgelinkd's ServiceAccount, NAMESPACE:NAME: the only one whose tokens
    /// may report.
    #[arg(long, default_value = "edgelink-system:edgelinkd", value_parser = service_account_arg)]
    webhook_service_account: String,
    /// Removed: the shared token of the Secret edgelink-status-token let any
    /// holder report for any node. Ignored (a warning) so that an old
    /// Deployment still starts; docs/operator.md, "Upgrading".
    #[arg(long, env = "EDGELINK_OPERATOR_WEBHOOK_TOKEN_FILE", hide = true)]
    webhook_token_file: Option<PathBuf>,
    /// The proxy pod's image (it only holds a network namespace).
    #[arg(long, default_value = "registry.k8s.io/pause:3.9")]
    proxy_image: String,
    /// The node label edgelinkd's DaemonSet selects; proxy pods require it too
    /// (empty: do not require a label).
    #[arg(long, default_value = "edgelink.io/edge=true", value_parser = label_arg)]
    edge_node_label: String,
    /// Reconcile every Device at least this often (seconds).
    #[arg(long, default_value = "30", value_parser = secs)]
    resync: Duration,
    /// Write a Device's status when only its live fields moved (counters,
    /// lastSeen, latency, reportedAt) at most this often (seconds); a
    /// change of state is written at once. A plant of 1000 Devices writes
    /// 1000 / this statuses per second.
    #[arg(long, default_value = "30", value_parser = secs)]
    status_refresh: Duration,
    /// Reconciles at once, at most. Unbounded, a plant's 1000 new Devices
    /// queued thousands of requests ahead of the Lease's renewal, and the
    /// leader lost its Lease.
    #[arg(long, default_value = "16", value_parser = clap::value_parser!(u16).range(1..))]
    concurrency: u16,
    /// A node's report older than this says nothing (seconds): DeviceReachable
    /// turns Unknown. Keep it above 2 x edgelinkd's --status-webhook-interval.
    #[arg(long, default_value = "35", value_parser = secs)]
    report_stale_after: Duration,
    /// A node whose edgelinkd sends heartbeats (--status-webhook-heartbeat)
    /// and has not been heard for this long is lost (seconds, fractions
    /// allowed): its proxy pods' readiness gates and Ready turn False, so
    /// they leave their Services' endpoints, unless no other node of the
    /// Device serves. A node that sends none: --report-stale-after.
    #[arg(long, default_value = "1.5", value_parser = bound)]
    node_lost_after: Duration,
    /// The cluster's DNS domain: a headless Service a Device's reverse
    /// entry names is rendered as <name>.<namespace>.svc.<this>.
    #[arg(long, env = "EDGELINK_CLUSTER_DOMAIN", default_value = "cluster.local", value_parser = domain_arg)]
    cluster_domain: String,
    /// error, warn, info, debug or trace.
    #[arg(long, default_value = "info", value_parser = ["error", "warn", "info", "debug", "trace"])]
    log_level: String,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Crds { without_cel } => {
            if without_cel {
                print!("{}", edgelink_operator::crd::crds_yaml_without_cel());
            } else {
                print!("{}", edgelink_operator::crd::crds_yaml());
            }
            Ok(())
        }
        Cmd::Run(args) => {
            tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                        tracing_subscriber::EnvFilter::new(format!("{},kube=warn", args.log_level))
                    }),
                )
                .with_writer(std::io::stderr)
                .init();
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?
                .block_on(run(*args))
        }
    }
}

async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    if let Some(f) = &args.webhook_token_file {
        tracing::warn!(
            file = %f.display(),
            "--webhook-token-file is ignored: reports are taken with edgelinkd's ServiceAccount token only (docs/operator.md, Upgrading)"
        );
    }
    let metrics = Arc::new(Metrics::new());
    let config = kube::Config::infer()
        .await
        .context("no Kubernetes API: not in a pod, and no $KUBECONFIG or ~/.kube/config")?;
    // Every request counted (edgelink_operator_api_requests_total).
    let client = kube::client::ClientBuilder::try_from(config)
        .context("a client for the Kubernetes API")?
        .with_layer(&run::requests::Counting::new(metrics.api_requests.clone()))
        .build();
    preflight(&client).await?;

    let (reports, triggers) = Reports::new(args.node_lost_after, args.report_stale_after);
    let reports = Arc::new(reports);
    tokio::spawn(run::reports::watchdog(reports.clone()));
    let (namespace, service_account) = args
        .webhook_service_account
        .split_once(':')
        .context("--webhook-service-account")?;
    let expect = edgelink_operator::sender::Expect {
        audience: args.webhook_audience.clone(),
        namespace: namespace.to_string(),
        service_account: service_account.to_string(),
    };
    let auth = run::auth::Auth::new(expect, Box::new(run::auth::Kube(client.clone())));
    // A virtual address's grant lasts as long as a silent node takes to be
    // lost: a lost holder's address moves then.
    let holds = Arc::new(run::grants::Holds::new(args.node_lost_after));
    let access = Arc::new(run::rules::Access::default());
    let app = Arc::new(App::new(
        metrics.clone(),
        reports.clone(),
        holds.clone(),
        access.book.clone(),
        auth,
    ));
    let listener = run::server::bind(args.listen).await?;
    let server = tokio::spawn(run::server::serve(
        app.clone(),
        listener,
        run::server::LIMITS,
    ));

    let identity = args
        .identity
        .clone()
        .or_else(nix_hostname)
        .unwrap_or_else(|| format!("edgelink-operator-{}", std::process::id()));
    let election = Election {
        namespace: args.namespace.clone(),
        lease: args.lease.clone(),
        identity: identity.clone(),
    };
    let term = shutdown_signal();
    tokio::pin!(term);
    let (mut lease, lease_task) = tokio::select! {
        r = run::leader::acquire(client.clone(), &election) => r?,
        _ = &mut term => {
            tracing::info!("stopped before leading");
            return Ok(());
        }
        r = server => return Err(anyhow::anyhow!("the HTTP endpoint stopped: {r:?}")),
    };
    holds.leading();
    app.leader.store(true, Ordering::Relaxed);
    metrics.leader.set(1);
    if !args.webhook_service.is_empty() {
        match args.pod_ip {
            Some(ip) => {
                run::leader::claim_webhook(
                    client.clone(),
                    &args.namespace,
                    &args.webhook_service,
                    &identity,
                    ip,
                    args.listen.port(),
                )
                .await?
            }
            None => tracing::warn!(
                "no --pod-ip ($POD_IP): the webhook Service's Endpoints are left alone"
            ),
        }
    }
    // Live nodes' heartbeats reach the new leader within a second (the
    // webhook Service points at it now); an older edgelinkd reports every
    // 10 s, and may be taken as lost meanwhile if another node serves.
    let fresh_for = Duration::from_secs(6).max(args.node_lost_after * 4);
    app.reports.leading(fresh_for);
    let (caches, writers) = run::caches::Caches::new();
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        settings: ProxyPodSettings {
            image: args.proxy_image.clone(),
            edge_label: label(&args.edge_node_label),
        },
        reports,
        holds,
        metrics: metrics.clone(),
        resync: args.resync,
        status_refresh: args.status_refresh,
        concurrency: args.concurrency,
        written: Default::default(),
        stale_after: args.report_stale_after,
        started: Instant::now(),
        fresh_for,
        cluster_domain: args.cluster_domain.clone(),
        devices: std::sync::OnceLock::new(),
        caches,
        access,
        recorder: kube::runtime::events::Recorder::new(
            client.clone(),
            kube::runtime::events::Reporter {
                controller: "edgelink-operator".into(),
                instance: Some(identity.clone()),
            },
        ),
    });
    let consumers = tokio::spawn(run::consumers::run(client.clone(), metrics.clone()));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let controller = tokio::spawn(run::controller::run(
        ctx,
        writers,
        triggers,
        app.clone(),
        async move {
            let _ = stop_rx.await;
        },
    ));
    let lost = tokio::select! {
        _ = &mut term => false,
        _ = lease.wait_for(|leading| !*leading) => true,
    };
    // Stop reconciling before the lease is given up.
    app.leader.store(false, Ordering::Relaxed);
    metrics.leader.set(0);
    let _ = stop_tx.send(());
    consumers.abort();
    let _ = tokio::time::timeout(Duration::from_secs(10), controller).await;
    drop(lease);
    let _ = tokio::time::timeout(Duration::from_secs(5), lease_task).await;
    if lost {
        // Another replica leads now; start over as a standby.
        anyhow::bail!(
            "lost the lease {}/{}: exiting so that the pod restarts as a standby",
            args.namespace,
            args.lease
        );
    }
    tracing::info!("stopped; lease released");
    Ok(())
}

fn nix_hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
}

/// The APIs the operator needs must be there: its CRDs and Multus's NAD.
async fn preflight(client: &kube::Client) -> anyhow::Result<()> {
    use edgelink_operator::crd::{Device, DeviceLease, EdgeNetwork, NetworkAttachmentDefinition};
    use kube::api::{Api, ListParams};
    let lp = ListParams::default().limit(1);
    Api::<Device>::all(client.clone())
        .list(&lp)
        .await
        .context("Device (devices.edgelink.io) cannot be listed: kubectl apply -f daemonset/operator/crds.yaml, and check the RBAC")?;
    Api::<EdgeNetwork>::all(client.clone())
        .list(&lp)
        .await
        .context("EdgeNetwork (edgenetworks.edgelink.io) cannot be listed: kubectl apply -f daemonset/operator/crds.yaml")?;
    Api::<DeviceLease>::all(client.clone())
        .list(&lp)
        .await
        .context("DeviceLease (deviceleases.edgelink.io) cannot be listed: kubectl apply -f daemonset/operator/crds.yaml and rbac.yaml")?;
    Api::<NetworkAttachmentDefinition>::all(client.clone())
        .list(&lp)
        .await
        .context(
            "NetworkAttachmentDefinition (k8s.cni.cncf.io) cannot be listed: is Multus installed?",
        )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent_and_parses() {
        Cli::command().debug_assert();
        let Cmd::Run(a) = Cli::try_parse_from(["edgelink-operator", "run"])
            .unwrap()
            .cmd
        else {
            panic!("not run")
        };
        assert_eq!(
            label(&a.edge_node_label),
            Some(("edgelink.io/edge".into(), "true".into()))
        );
        assert_eq!(
            (
                a.resync,
                a.report_stale_after,
                a.status_refresh,
                a.concurrency
            ),
            (
                Duration::from_secs(30),
                Duration::from_secs(35),
                Duration::from_secs(30),
                16
            )
        );
        let Cmd::Run(a) =
            Cli::try_parse_from(["edgelink-operator", "run", "--edge-node-label", ""])
                .unwrap()
                .cmd
        else {
            panic!("not run")
        };
        assert_eq!(label(&a.edge_node_label), None);
        assert_eq!(a.cluster_domain, "cluster.local");
        assert_eq!(
            (
                a.webhook_audience.as_str(),
                a.webhook_service_account.as_str()
            ),
            ("edgelink-operator", "edgelink-system:edgelinkd")
        );
        for bad in [
            &["--edge-node-label", "=x"][..],
            &["--resync", "0"],
            &["--status-refresh", "0"],
            &["--concurrency", "0"],
            &["--listen", "nowhere"],
            &["--cluster-domain", "a..b"],
            &["--webhook-service-account", "edgelinkd"],
            &["--webhook-service-account", "ns:"],
        ] {
            let mut argv = vec!["edgelink-operator", "run"];
            argv.extend_from_slice(bad);
            let e = Cli::try_parse_from(argv)
                .err()
                .expect("refused")
                .to_string();
            assert!(e.contains(bad[0]), "{bad:?}: {e}");
        }
    }
}
