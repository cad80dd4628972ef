//! `edgelinkd audit`'s flags.

use std::net::SocketAddr;

/// `edgelinkd audit`'s flags.
#[derive(Debug, Clone, clap::Args)]
pub struct AuditArgs {
    /// Address of the daemon's HTTP endpoint (`host:port` resolved).
    #[arg(long, env = "EDGELINKD_STATUS_ADDR", default_value = super::DEFAULT_STATUS_ADDR, value_parser = super::socket_addr)]
    pub status_addr: SocketAddr,
    /// Only this Device's connections (`namespace/name`, or its name).
    #[arg(long)]
    pub device: Option<String>,
    /// Only those that ended this long ago or later (`1h`, `30m`, `90s`).
    #[arg(long, value_parser = since)]
    pub since: Option<String>,
    /// Print the JSON lines instead of a table.
    #[arg(long)]
    pub json: bool,
}

fn since(s: &str) -> Result<String, String> {
    edgelink_access::audit::since(s).map(|_| s.to_string())
}
