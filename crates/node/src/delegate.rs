//! The DEL of a delegated IPAM plugin (host-local, whereabouts, ...) for
//! an attachment the daemon reclaims because its pod went without a DEL:
//! run as the plugin's own DEL runs it (`edgelink-cni-exec`), with the
//! network configuration the record kept and an empty `CNI_NETNS`.
//!
//! Only with `--cni-path` (off by default, docs/configuration.md): the
//! delegate must see the same files and credentials as when the runtime
//! ran it, which a daemon in a container does not, unless it is given them.
//! This module decides nothing about the record (reclaim.rs keeps it while
//! the release fails) and must not touch the built-in IPAM.

use edgelink_attachment::Record;
use edgelink_cni_exec::{Environment, ExecError, Invocation};
use edgelink_cni_spec::Command;
use std::path::PathBuf;
use std::time::Duration;

/// How long a delegate's DEL may take before it is killed (the reconcile
/// pass waits for it).
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// The delegated IPAM plugin the record's configuration names, if any (as
/// the plugin's DEL decides: any `ipam.type` but empty and `edgelink`).
pub fn plugin_of(rec: &Record) -> Option<&str> {
    rec.cni_config
        .as_ref()?
        .get("ipam")?
        .get("type")?
        .as_str()
        .filter(|t| !t.is_empty() && *t != "edgelink")
}

/// Run the delegate's DEL for `rec` from `dirs` (blocking, at most
/// [`TIMEOUT`]). `Ok(None)`: the record has no delegated IPAM.
pub fn release(rec: &Record, dirs: &[PathBuf]) -> Result<Option<String>, ExecError> {
    let (Some(plugin), Some(config)) = (plugin_of(rec), rec.cni_config.as_ref()) else {
        return Ok(None);
    };
    let mut args = vec!["IgnoreUnknown=1".to_string()];
    for (k, v) in [
        ("K8S_POD_NAMESPACE", &rec.pod_namespace),
        ("K8S_POD_NAME", &rec.pod_name),
        ("K8S_POD_UID", &rec.pod_uid),
    ] {
        if let Some(v) = v {
            args.push(format!("{k}={v}"));
        }
    }
    let path = dirs
        .iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(":");
    let inv = Invocation {
        plugin,
        dirs,
        command: Command::Del,
        env: Environment::Only(vec![
            ("CNI_CONTAINERID", rec.container_id.clone()),
            ("CNI_IFNAME", rec.ifname.clone()),
            ("CNI_NETNS", String::new()),
            ("CNI_PATH", path),
            ("CNI_ARGS", args.join(";")),
        ]),
        timeout: Some(TIMEOUT),
    };
    edgelink_cni_exec::exec(&inv, config)?;
    Ok(Some(plugin.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record(config: Option<serde_json::Value>) -> Record {
        Record {
            version: 1,
            container_id: "c".into(),
            ifname: "net1".into(),
            netns: "/run/netns/x".into(),
            network: "n".into(),
            mode: "bridge".into(),
            pod_namespace: None,
            pod_name: None,
            pod_uid: None,
            interface: edgelink_attachment::RecordInterface {
                name: "net1".into(),
                mac: "02:00:00:00:00:01".into(),
                ips: vec![],
            },
            forwards: vec![],
            allowed_targets: vec![],
            reverse: vec![],
            dns: None,
            health: None,
            virtual_addresses: Vec::new(),
            created_at: 0,
            cni_config: config,
            pid_namespace: None,
            netns_id: None,
            boot_id: None,
        }
    }

    #[test]
    fn only_a_named_ipam_plugin_is_a_delegate() {
        assert_eq!(plugin_of(&record(None)), None);
        assert_eq!(plugin_of(&record(Some(json!({"ipam": {}})))), None);
        for builtin in ["", "edgelink"] {
            let r = record(Some(json!({"ipam": {"type": builtin}})));
            assert_eq!(plugin_of(&r), None);
        }
        let r = record(Some(json!({"ipam": {"type": "host-local"}})));
        assert_eq!(plugin_of(&r), Some("host-local"));
        // Nothing to run: success without a plugin.
        assert!(release(&record(None), &[]).unwrap().is_none());
    }
}
