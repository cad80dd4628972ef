//! daemonset/ against the code: the DaemonSet runs `edgelinkd` with flags
//! it accepts and mounts, at the paths those flags and the plugin use, what
//! the daemon reads and writes; install.yaml is the concatenation of the
//! manifests beside it.

use crate::config::{Cli, Command, DEFAULT_STATE_DIR};
use clap::Parser;
use serde::Deserialize;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_norway::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .filter(|v| !v.is_null())
        .collect()
}

fn daemonset() -> Value {
    documents(&repo().join("daemonset/daemonset.yaml"))
        .into_iter()
        .find(|d| d["kind"] == "DaemonSet")
        .expect("a DaemonSet in daemonset/daemonset.yaml")
}

fn container<'a>(pod: &'a Value, list: &str, name: &str) -> &'a Value {
    pod[list]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no {list} entry named {name}"))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|s| s.as_str().expect("a string").to_string())
        .collect()
}

/// The host path behind the container's mount at `mount_path`, and the
/// mount itself.
fn mount<'a>(pod: &'a Value, c: &'a Value, mount_path: &str) -> (&'a str, &'a Value) {
    let m = c["volumeMounts"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["mountPath"] == mount_path))
        .unwrap_or_else(|| panic!("{} mounts nothing at {mount_path}", c["name"]));
    let vol = pod["volumes"]
        .as_array()
        .and_then(|vs| vs.iter().find(|v| v["name"] == m["name"]))
        .unwrap_or_else(|| panic!("no volume {}", m["name"]));
    let host = vol["hostPath"]["path"]
        .as_str()
        .unwrap_or_else(|| panic!("volume {} is not a hostPath", m["name"]));
    (host, m)
}

#[test]
fn the_daemonset_runs_edgelinkd_with_what_it_uses() {
    let ds = daemonset();
    let pod = &ds["spec"]["template"]["spec"];
    let c = container(pod, "containers", "edgelinkd");

    // Its command line parses, and names the paths below.
    let mut argv = strings(&c["command"]);
    argv.extend(strings(&c["args"]));
    let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    let Command::Run(args) = cli.command else {
        panic!("{argv:?} is not `edgelinkd run`");
    };

    // The records, IPAM store and control socket: where the plugin writes
    // them on the host (its default stateDir), at the daemon's --state-dir.
    let (host, m) = mount(pod, c, args.state_dir.to_str().unwrap());
    assert_eq!(host, DEFAULT_STATE_DIR);
    assert_ne!(
        m["readOnly"], true,
        "the daemon removes records and releases addresses"
    );

    // Pod network namespaces: records hold the runtime's paths
    // (/var/run/netns/... for containerd and CRI-O), opened as they are,
    // including those mounted after the daemon started.
    let (host, m) = mount(pod, c, "/var/run/netns");
    assert_eq!(host, "/var/run/netns");
    assert_eq!(m["mountPropagation"], "HostToContainer");

    // Probes reach the status address the daemon binds.
    let addr = args.status_addr;
    for (probe, path) in [("livenessProbe", "/livez"), ("readinessProbe", "/healthz")] {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["path"], path, "{probe}");
        assert_eq!(get["port"], addr.port(), "{probe}");
        assert_eq!(get["host"], addr.ip().to_string(), "{probe}");
    }
    if addr.ip().is_loopback() {
        assert_eq!(
            pod["hostNetwork"], true,
            "the kubelet probes the node's loopback"
        );
    }

    // The kubelet waits longer than the daemon drains.
    let grace = pod["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("a grace period");
    assert!(
        grace > args.grace_period.as_secs(),
        "{grace} s <= --grace-period"
    );

    // NODE_NAME for /status.
    let env = c["env"].as_array().expect("env");
    assert!(env
        .iter()
        .any(|e| e["name"] == "NODE_NAME"
            && e["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"));

    // Least privilege.
    let sc = &c["securityContext"];
    assert_ne!(sc["privileged"], true);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(strings(&sc["capabilities"]["drop"]), ["ALL"]);
    for cap in strings(&sc["capabilities"]["add"]) {
        assert!(
            ["SYS_ADMIN", "NET_ADMIN", "NET_BIND_SERVICE"].contains(&cap.as_str()),
            "capability {cap} is not justified in docs/security.md"
        );
    }
    for kind in ["requests", "limits"] {
        assert!(c["resources"][kind].is_object(), "no resources.{kind}");
    }
    assert_eq!(pod["nodeSelector"]["edgelink.io/edge"], "true");
}

#[test]
fn the_init_container_installs_the_plugin_into_the_hosts_cni_bin() {
    let ds = daemonset();
    let pod = &ds["spec"]["template"]["spec"];
    let init = container(pod, "initContainers", "install-cni");
    let env = |name: &str| -> String {
        init["env"]
            .as_array()
            .and_then(|e| e.iter().find(|e| e["name"] == name))
            .and_then(|e| e["value"].as_str())
            .unwrap_or_else(|| panic!("install-cni has no {name}"))
            .to_string()
    };
    let (host, _) = mount(pod, init, &env("CNI_BIN_DIR"));
    assert_eq!(host, "/opt/cni/bin");
    let (host, _) = mount(pod, init, &env("STATE_DIR"));
    assert_eq!(host, DEFAULT_STATE_DIR);
    // The image has the plugin and the script where the manifest says.
    let dockerfile = std::fs::read_to_string(repo().join("daemonset/Dockerfile")).unwrap();
    let script = strings(&init["command"]).remove(0);
    for path in [env("SRC"), script] {
        assert!(
            dockerfile.contains(&path),
            "the Dockerfile puts nothing at {path}"
        );
    }
    // Copy to a temporary name, then rename(2): a running binary is never
    // overwritten.
    let install = std::fs::read_to_string(repo().join("daemonset/install-cni.sh")).unwrap();
    assert!(
        install.contains("mv -f"),
        "install-cni.sh does not rename into place"
    );
}

#[test]
fn install_yaml_is_the_manifests_concatenated() {
    let dir = repo().join("daemonset");
    let mut parts = Vec::new();
    for f in ["namespace.yaml", "serviceaccount.yaml", "daemonset.yaml"] {
        parts.extend(documents(&dir.join(f)));
    }
    assert_eq!(
        documents(&dir.join("install.yaml")),
        parts,
        "run make install-yaml"
    );
    for d in &parts {
        if d["kind"] != "Namespace" {
            assert_eq!(
                d["metadata"]["namespace"], "edgelink-system",
                "{}",
                d["kind"]
            );
        }
    }
}
