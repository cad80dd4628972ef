//! daemonset/ against the code: the DaemonSet runs `edgelinkd` with flags
//! it accepts and mounts, at the paths those flags and the plugin use, what
//! the daemon reads and writes; install.yaml is the concatenation of the
//! manifests beside it. (It reads the command line from edgelinkd's
//! library target, `edgelinkd::config`.)

use clap::Parser;
use edgelinkd::config::{Cli, Command, DEFAULT_STATE_DIR};
use serde::Deserialize;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
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
    // (/var/run/netns/... or /run/netns/...), opened as they are, including
    // those mounted after the daemon started. The host path is /run/netns:
    // containerd checks the propagation of the literal path, and through
    // the /var/run symlink it finds / (refused when / is private). The
    // image makes /var/run lead to /run, so both spellings reach it.
    let (host, m) = mount(pod, c, "/run/netns");
    assert_eq!(host, "/run/netns");
    assert_eq!(m["mountPropagation"], "HostToContainer");
    assert_no_var_run_host_path(pod);

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

    // Updates that drop nothing (docs/install.md): a new daemon started
    // beside the old one takes everything over (--takeover, harmless when
    // none runs), and knows itself by its pod's UID, which a container
    // restarted after it handed over keeps: it is refused and idles.
    assert!(args.takeover, "{argv:?}: no --takeover");
    let uid_var = env
        .iter()
        .find(|e| e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid")
        .expect("an environment variable with the pod's UID");
    assert_eq!(
        Some(uid_var["name"].as_str().unwrap()),
        instance_id_env().as_deref(),
        "the pod's UID must reach --instance-id"
    );
    assert!(
        !argv.iter().any(|a| a.starts_with("--instance-id")),
        "--instance-id on the command line would be the same for every pod"
    );
    // A second edgelinkd pod on the node (surge, second DaemonSet) must
    // fit: with hostNetwork every declared port is a hostPort, which the
    // scheduler gives to one pod of a node only.
    assert_no_host_ports(pod);

    // Least privilege.
    let sc = &c["securityContext"];
    assert_ne!(sc["privileged"], true);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(strings(&sc["capabilities"]["drop"]), ["ALL"]);
    for cap in strings(&sc["capabilities"]["add"]) {
        assert!(
            ["SYS_ADMIN", "NET_ADMIN", "NET_BIND_SERVICE", "NET_RAW"].contains(&cap.as_str()),
            "capability {cap} is not justified in docs/security.md"
        );
    }
    for kind in ["requests", "limits"] {
        assert!(c["resources"][kind].is_object(), "no resources.{kind}");
    }
    assert_eq!(pod["nodeSelector"]["edgelink.io/edge"], "true");
}

/// The environment variable `edgelinkd run --instance-id` reads.
/// Review item 6: what TCP clients that never read can make the daemon
/// hold with the DaemonSet's args fits its memory limit, with room for the
/// daemon itself (docs/configuration.md, "Memory").
#[test]
fn the_daemonsets_connection_bounds_fit_its_memory_limit() {
    let ds = daemonset();
    let c = container(&ds["spec"]["template"]["spec"], "containers", "edgelinkd");
    let mut argv = strings(&c["command"]);
    argv.extend(strings(&c["args"]));
    let Ok(Cli {
        command: Command::Run(a),
        ..
    }) = Cli::try_parse_from(&argv)
    else {
        panic!("{argv:?}");
    };
    let limit = c["resources"]["limits"]["memory"].as_str().unwrap();
    let limit: u64 = limit.strip_suffix("Mi").unwrap().parse::<u64>().unwrap() << 20;
    assert!(
        a.max_connections > 0 && a.socket_buffer > 0 && a.pipe_budget > 0,
        "{argv:?}"
    );
    let per_conn = 4 * 2 * a.socket_buffer as u64 + 2 * 16 * 1024;
    let bound = u64::from(a.max_connections) * per_conn + a.pipe_budget as u64;
    assert!(
        bound + (64 << 20) <= limit,
        "{bound} + 64 MiB above the limit {limit}"
    );
}

fn instance_id_env() -> Option<String> {
    use clap::CommandFactory;
    let cli = Cli::command();
    let run = cli
        .get_subcommands()
        .find(|c| c.get_name() == "run")
        .expect("edgelinkd run");
    let arg = run
        .get_arguments()
        .find(|a| a.get_long() == Some("instance-id"))
        .expect("edgelinkd run --instance-id");
    arg.get_env().map(|e| e.to_string_lossy().into_owned())
}

/// No port declared by a host-network pod's containers: each would be a
/// hostPort (the API sets hostPort = containerPort), and the scheduler would
/// keep a second edgelinkd pod off the node, so no update could start the
/// new daemon beside the old one to take over.
fn assert_no_host_ports(pod: &Value) {
    if pod["hostNetwork"] != true {
        return;
    }
    for list in ["initContainers", "containers"] {
        for c in pod[list].as_array().into_iter().flatten() {
            assert!(
                c["ports"].as_array().is_none_or(|p| p.is_empty()),
                "{}: ports {} on a host-network pod are hostPorts: a second edgelinkd pod (surge, \
                 second DaemonSet) could not be scheduled on the node",
                c["name"],
                c["ports"]
            );
        }
    }
}

/// No hostPath under /var/run: a propagated mount there is refused on a node
/// whose / is a private mount (the runtime resolves the symlink to /).
fn assert_no_var_run_host_path(pod: &Value) {
    for v in pod["volumes"].as_array().into_iter().flatten() {
        if let Some(path) = v["hostPath"]["path"].as_str() {
            assert!(
                !path.starts_with("/var/run/"),
                "volume {}: hostPath {path}: use /run/... (/var/run is a symlink)",
                v["name"]
            );
        }
    }
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
    let offline = std::fs::read_to_string(repo().join("scripts/image-offline.sh")).unwrap();
    let script = strings(&init["command"]).remove(0);
    for path in [env("SRC"), script] {
        assert!(
            dockerfile.contains(&path),
            "the Dockerfile puts nothing at {path}"
        );
        // scripts/image-offline.sh installs into "$root$path".
        assert!(
            offline.contains(&format!("\"$root{path}\"")),
            "scripts/image-offline.sh puts nothing at {path}"
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
fn the_daemonset_runs_the_nft_the_image_carries() {
    let ds = daemonset();
    let pod = &ds["spec"]["template"]["spec"];
    let c = container(pod, "containers", "edgelinkd");
    let mut argv = strings(&c["command"]);
    argv.extend(strings(&c["args"]));
    let Command::Run(args) = Cli::try_parse_from(&argv).unwrap().command else {
        panic!("{argv:?} is not `edgelinkd run`");
    };
    // A path, not a name looked up in PATH (the kernel path runs it in
    // every pod's netns), at which both images put nft.
    let nft = args.nft.to_str().unwrap();
    assert!(args.nft.is_absolute(), "--nft={nft}: name it by path");
    let dockerfile = std::fs::read_to_string(repo().join("daemonset/Dockerfile")).unwrap();
    assert!(
        dockerfile.contains("nftables") && dockerfile.contains(&format!("{nft} --version")),
        "the Dockerfile installs no nft at {nft}"
    );
    let offline = std::fs::read_to_string(repo().join("scripts/image-offline.sh")).unwrap();
    assert!(
        offline.contains(&format!("\"$root{nft}\"")),
        "scripts/image-offline.sh puts no nft at {nft}"
    );
    // nft needs CAP_NET_ADMIN in the pod's netns.
    let caps = strings(&c["securityContext"]["capabilities"]["add"]);
    assert!(caps.iter().any(|c| c == "NET_ADMIN"), "{caps:?}");
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

/// The oldest Kubernetes the manifests are written for (docs/install.md,
/// "Supported Kubernetes versions"): the lab's v1.20.2.
const MIN_KUBERNETES: (u32, u32) = (1, 20);

/// Fields the API server of an older Kubernetes refuses (or, for pod
/// fields, drops) that a manifest of this repository could plausibly use:
/// (kind, path, the minor version that added it). `*` is every element of
/// a list; a path under `pod.` is looked up in every pod template.
const NEWER_FIELDS: &[(&str, &str, u32)] = &[
    (
        "DaemonSet",
        "spec.updateStrategy.rollingUpdate.maxSurge",
        21,
    ),
    ("StatefulSet", "spec.minReadySeconds", 22),
    (
        "StatefulSet",
        "spec.persistentVolumeClaimRetentionPolicy",
        23,
    ),
    (
        "StatefulSet",
        "spec.updateStrategy.rollingUpdate.maxUnavailable",
        24,
    ),
    ("StatefulSet", "spec.ordinals", 26),
    ("Service", "spec.internalTrafficPolicy", 21),
    ("Service", "spec.loadBalancerClass", 21),
    ("*", "pod.os", 23),
    ("*", "pod.hostUsers", 25),
    ("*", "pod.schedulingGates", 26),
    ("*", "pod.resourceClaims", 26),
    ("*", "pod.topologySpreadConstraints.*.minDomains", 24),
    ("*", "pod.topologySpreadConstraints.*.matchLabelKeys", 25),
    ("*", "pod.initContainers.*.restartPolicy", 28),
    ("*", "pod.containers.*.resizePolicy", 27),
];

/// The values at `path` in `v` (`*` expands a list).
fn lookup<'a>(v: &'a Value, path: &[&str], out: &mut Vec<&'a Value>) {
    match path.split_first() {
        None => out.push(v),
        Some((&"*", rest)) => {
            for e in v.as_array().into_iter().flatten() {
                lookup(e, rest, out);
            }
        }
        Some((key, rest)) => {
            if let Some(next) = v.get(*key) {
                lookup(next, rest, out);
            }
        }
    }
}

/// The pod specs of a manifest: a Pod's spec, or a workload's template.
fn pod_specs(doc: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    if doc["kind"] == "Pod" {
        lookup(doc, &["spec"], &mut out);
    }
    lookup(doc, &["spec", "template", "spec"], &mut out);
    lookup(
        doc,
        &["spec", "jobTemplate", "spec", "template", "spec"],
        &mut out,
    );
    out
}

/// The fields of `doc` newer than `floor`, as "Kind/name: path (1.N)".
fn newer_fields(doc: &Value, floor: (u32, u32)) -> Vec<String> {
    let mut found = Vec::new();
    for &(kind, path, since) in NEWER_FIELDS {
        if (1, since) <= floor || (kind != "*" && doc["kind"] != kind) {
            continue;
        }
        let mut hits = Vec::new();
        let parts: Vec<&str> = path.split('.').collect();
        if parts[0] == "pod" {
            for pod in pod_specs(doc) {
                lookup(pod, &parts[1..], &mut hits);
            }
        } else {
            lookup(doc, &parts, &mut hits);
        }
        if !hits.is_empty() {
            found.push(format!(
                "{}/{}: {path} (Kubernetes 1.{since})",
                doc["kind"].as_str().unwrap_or("?"),
                doc["metadata"]["name"].as_str().unwrap_or("?")
            ));
        }
    }
    found
}

/// Every manifest a user applies: daemonset/ and cni-conf/ (recursively).
fn all_manifests() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "yaml") {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(&repo().join("daemonset"), &mut out);
    walk(&repo().join("cni-conf"), &mut out);
    // daemonset/upgrade/ holds patches for newer Kubernetes, applied by
    // hand where it has what they use (checked below, one by one).
    out.retain(|p| !p.starts_with(repo().join("daemonset/upgrade")));
    out
}

/// `kubectl patch`'s strategic merge, as far as these patches need it:
/// maps merge, everything else replaces.
fn merge(into: &mut Value, patch: &Value) {
    match (into, patch) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b.clone(),
    }
}

#[test]
fn the_surge_patch_makes_updates_take_overs_on_kubernetes_1_22_and_newer() {
    let path = repo().join("daemonset/upgrade/surge.yaml");
    let patches = documents(&path);
    assert_eq!(patches.len(), 1, "one patch");
    let mut ds = daemonset();
    merge(&mut ds, &patches[0]);
    let ru = &ds["spec"]["updateStrategy"]["rollingUpdate"];
    assert_eq!(ds["spec"]["updateStrategy"]["type"], "RollingUpdate");
    // The new pod first, the old one deleted once the new one is ready: a
    // node always has a daemon, and the new one takes over.
    assert_eq!(ru["maxSurge"], 1);
    assert_eq!(ru["maxUnavailable"], 0);
    // Ready for a while: the probe that made it ready was answered by the
    // new daemon, which took the status listener over (~50 ms), not by the
    // old one, and it did not exit (a failed take-over).
    let min_ready = ds["spec"]["minReadySeconds"].as_u64().unwrap_or(0);
    let probe =
        &container(&ds["spec"]["template"]["spec"], "containers", "edgelinkd")["readinessProbe"];
    assert!(min_ready >= 1, "minReadySeconds {min_ready}");
    assert!(
        min_ready >= probe["periodSeconds"].as_u64().unwrap_or(10),
        "minReadySeconds {min_ready} shorter than the readiness probe's period"
    );
    // Only where maxSurge exists: the docs say 1.22 (on by default).
    let newer = newer_fields(&ds, MIN_KUBERNETES);
    assert_eq!(
        newer,
        ["DaemonSet/edgelinkd: spec.updateStrategy.rollingUpdate.maxSurge (Kubernetes 1.21)"]
    );
    assert!(newer_fields(&ds, (1, 22)).is_empty());
    // The pods it surges fit beside the old ones, which take-overs need.
    assert_no_host_ports(&ds["spec"]["template"]["spec"]);
}

#[test]
fn no_manifest_uses_a_field_newer_than_the_oldest_supported_kubernetes() {
    let mut found = Vec::new();
    for path in all_manifests() {
        for doc in documents(&path) {
            for f in newer_fields(&doc, MIN_KUBERNETES) {
                found.push(format!("{}: {f}", path.display()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "fields that Kubernetes {}.{} refuses:\n{}",
        MIN_KUBERNETES.0,
        MIN_KUBERNETES.1,
        found.join("\n")
    );
}

#[test]
fn the_newer_fields_check_finds_maxsurge_in_a_daemonset() {
    // The DaemonSet as it was shipped before: 1.20 refused it with
    // `unknown field "maxSurge" in io.k8s.api.apps.v1.RollingUpdateDaemonSet`.
    let old: Value = serde_norway::from_str(
        "kind: DaemonSet\nmetadata: {name: edgelinkd}\n\
         spec:\n  updateStrategy:\n    type: RollingUpdate\n    rollingUpdate: {maxUnavailable: 1, maxSurge: 0}\n",
    )
    .unwrap();
    assert_eq!(
        newer_fields(&old, (1, 20)),
        ["DaemonSet/edgelinkd: spec.updateStrategy.rollingUpdate.maxSurge (Kubernetes 1.21)"]
    );
    assert!(newer_fields(&old, (1, 21)).is_empty(), "1.21 has it");
    // A Deployment's maxSurge is as old as Deployments.
    let deploy: Value = serde_norway::from_str(
        "kind: Deployment\nmetadata: {name: d}\nspec: {strategy: {rollingUpdate: {maxSurge: 0}}}\n",
    )
    .unwrap();
    assert!(newer_fields(&deploy, (1, 20)).is_empty());
    // Pod fields are found in templates, in lists too.
    let sts: Value = serde_norway::from_str(
        "kind: StatefulSet\nmetadata: {name: s}\nspec:\n  template:\n    spec:\n      os: {name: linux}\n      initContainers: [{name: a, restartPolicy: Always}]\n",
    )
    .unwrap();
    assert_eq!(newer_fields(&sts, (1, 20)).len(), 2);
    // The old daemonset.yaml itself, through the same walk as the real test.
    let text = std::fs::read_to_string(repo().join("daemonset/daemonset.yaml")).unwrap();
    let with_surge = text.replace(
        "      maxUnavailable: 1\n",
        "      maxUnavailable: 1\n      maxSurge: 0\n",
    );
    assert_ne!(with_surge, text, "the rollingUpdate block moved");
    let doc: Value = serde_norway::from_str(&with_surge).unwrap();
    assert_eq!(newer_fields(&doc, MIN_KUBERNETES).len(), 1);
}

/// The proxy pods of cni-conf/expose-a-device/ (and its variants): the
/// device sees their net1 address, which must survive a pod's
/// replacement. Sticky addresses key on the pod's namespace and name, so
/// the proxies are StatefulSets of one pod pinned to one node: a
/// replacement has the same name, on the same node (whose IPAM store holds
/// the memory).
#[test]
fn expose_a_device_proxies_keep_their_name_and_node() {
    let mut files = Vec::new();
    for p in all_manifests() {
        if p.components().any(|c| c.as_os_str() == "expose-a-device") {
            files.push(p);
        }
    }
    let docs: Vec<Value> = files.iter().flat_map(|p| documents(p)).collect();
    let service = docs
        .iter()
        .find(|d| d["kind"] == "Service")
        .expect("a Service in expose-a-device/");
    let proxies: Vec<&Value> = docs
        .iter()
        .filter(|d| {
            !pod_specs(d).is_empty()
                && d["spec"]["template"]["metadata"]["annotations"]
                    .get("k8s.v1.cni.cncf.io/networks")
                    .is_some()
        })
        .collect();
    assert!(proxies.len() >= 2, "statefulset.yaml and two-edge-nodes/");
    let subset = |sel: &Value, labels: &Value| {
        sel.as_object()
            .is_some_and(|m| !m.is_empty() && m.iter().all(|(k, v)| labels[k] == *v))
    };
    let mut nodes = Vec::new();
    for p in &proxies {
        let name = p["metadata"]["name"].as_str().unwrap();
        assert_eq!(
            p["kind"], "StatefulSet",
            "{name}: a Deployment's replacement pod has a new name, hence a new sticky address"
        );
        assert_eq!(p["spec"]["replicas"], 1, "{name}: one pod, <name>-0");
        assert_eq!(p["spec"]["serviceName"], service["metadata"]["name"]);
        let labels = &p["spec"]["template"]["metadata"]["labels"];
        assert!(
            subset(&p["spec"]["selector"]["matchLabels"], labels),
            "{name}: selector"
        );
        assert!(
            subset(&service["spec"]["selector"], labels),
            "{name}: the Service does not select it"
        );
        // Pinned to one node, and labelled with it: the labels keep the
        // selectors of two proxies of one device apart.
        let node = p["spec"]["template"]["spec"]["nodeSelector"]["kubernetes.io/hostname"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: not pinned to a node"));
        assert_eq!(labels["edgelink.io/node"], node, "{name}");
        assert_eq!(
            p["spec"]["selector"]["matchLabels"]["edgelink.io/node"], node,
            "{name}"
        );
        nodes.push(node.to_string());
    }
    let mut distinct = nodes.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        nodes.len(),
        "two proxies of one device on one node: {nodes:?}"
    );
}
