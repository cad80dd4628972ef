//! Fixtures for the scenario tests: network namespaces that clean up after
//! themselves, a lab that stands in for an edge node, and a runner that
//! drives the built plugin binary exactly as a runtime does (env + stdin,
//! inside the "node" namespace).
//!
//! Nothing here touches the host's own interfaces: every link lives in a
//! namespace a fixture created, and every namespace is deleted on drop.

use edgelink_attachment::RETIRED_ALIAS;
use serde_json::{json, Value};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A network namespace named `elkt-<role>-<pid>-<n>`, deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new(role: &str) -> Netns {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let name = format!("elkt-{role}-{}-{n}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        sh(&["ip", "netns", "add", &name]);
        let ns = Netns { name };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    pub fn path(&self) -> String {
        format!("/var/run/netns/{}", self.name)
    }

    /// `ip -n <ns> ARGS`, which must succeed.
    pub fn ip(&self, args: &[&str]) -> String {
        let mut full = vec!["ip", "-n", &self.name];
        full.extend_from_slice(args);
        sh(&full)
    }

    /// `ip -n <ns> ARGS`, whatever the outcome.
    pub fn ip_try(&self, args: &[&str]) -> Output {
        Command::new("ip")
            .args(["-n", &self.name])
            .args(args)
            .output()
            .expect("run ip")
    }

    /// Run a program inside the namespace.
    pub fn exec(&self, args: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(args)
            .output()
            .expect("run ip netns exec")
    }

    /// Names of the links in the namespace.
    pub fn links(&self) -> Vec<String> {
        let out = self.ip(&["-o", "link", "show"]);
        out.lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|n| n.split('@').next().unwrap_or(n).to_string())
            .collect()
    }

    pub fn has_link(&self, name: &str) -> bool {
        self.links().iter().any(|l| l == name)
    }

    /// `ip -o addr show dev X` as "a.b.c.d/n" strings (scope global only).
    pub fn addrs(&self, dev: &str) -> Vec<String> {
        let out = self.ip(&["-o", "addr", "show", "dev", dev, "scope", "global"]);
        out.lines()
            .filter_map(|l| {
                let mut it = l.split_whitespace();
                it.find(|w| *w == "inet" || *w == "inet6")?;
                it.next().map(str::to_string)
            })
            .collect()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// Run a command that must succeed; returns stdout.
pub fn sh(args: &[&str]) -> String {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .expect("spawn");
    assert!(
        out.status.success(),
        "{:?} failed: {}",
        args,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The plugin under test: `$EDGELINK_BIN`, else the workspace's current
/// `edgelink`, built by [`built_bins`] first.
pub fn plugin_bin() -> PathBuf {
    if let Ok(p) = std::env::var("EDGELINK_BIN") {
        return PathBuf::from(p);
    }
    built_bins().plugin.clone()
}

/// The binaries the scenario tests exec, as the current sources build them.
pub struct BuiltBins {
    pub plugin: PathBuf,
    pub daemon: PathBuf,
}

/// Build `edgelink` and `edgelinkd` from the workspace as it is now, once
/// per test process, and return where cargo put them.
///
/// The tests exec these binaries, which are no dependency of a test target,
/// so `cargo test` alone would neither build nor rebuild them: a plain
/// `cargo test` failed every scenario, and after an old build it quietly
/// tested the old code. So the harness runs the cargo that runs it
/// (`$CARGO`) once, with the same profile (and `--target`, when the tests
/// were built for one) and `--workspace`, so features unify as in
/// `cargo build --workspace` (`make test` builds that first; here cargo
/// then only checks that everything is fresh, ~0.2 s, and rebuilds
/// nothing). `cargo test` holds the build-directory lock only while it
/// compiles, not while the test binaries run, so this nested build does not
/// wait on it. The paths come from cargo's own artifact messages, so
/// `CARGO_TARGET_DIR`, `build.target-dir` and `build.build-dir` all work.
///
/// `EDGELINK_BIN` / `EDGELINKD_BIN` override each binary (the benchmarks
/// and the podman end-to-end test pass theirs); with both set, nothing is
/// built.
pub fn built_bins() -> &'static BuiltBins {
    static BINS: std::sync::OnceLock<Result<BuiltBins, String>> = std::sync::OnceLock::new();
    match BINS.get_or_init(build_bins) {
        Ok(b) => b,
        Err(e) => panic!("building the binaries under test failed: {e}"),
    }
}

fn build_bins() -> Result<BuiltBins, String> {
    let env_plugin = std::env::var_os("EDGELINK_BIN").map(PathBuf::from);
    let env_daemon = std::env::var_os("EDGELINKD_BIN").map(PathBuf::from);
    if let (Some(plugin), Some(daemon)) = (&env_plugin, &env_daemon) {
        return Ok(BuiltBins {
            plugin: plugin.clone(),
            daemon: daemon.clone(),
        });
    }
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .ok_or("no workspace directory")?
        .to_path_buf();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(&cargo);
    cmd.current_dir(&workspace)
        .args(["build", "--quiet", "--workspace"])
        .args(["--bin", "edgelink", "--bin", "edgelinkd"])
        .arg("--message-format=json-render-diagnostics")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let (profile, target) = test_profile();
    cmd.args(["--profile", &profile]);
    if let Some(t) = &target {
        cmd.args(["--target", t]);
    }
    let out = cmd
        .output()
        .map_err(|e| format!("run {}: {e}", PathBuf::from(&cargo).display()))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} exited with {} (its errors are above)",
            out.status
        ));
    }
    // One JSON message a line; a compiler-artifact of a bin target names
    // its executable.
    let mut found: [Option<PathBuf>; 2] = [None, None];
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if msg["reason"] != "compiler-artifact" {
            continue;
        }
        let (Some(name), Some(exe)) = (msg["target"]["name"].as_str(), msg["executable"].as_str())
        else {
            continue;
        };
        match name {
            "edgelink" => found[0] = Some(PathBuf::from(exe)),
            "edgelinkd" => found[1] = Some(PathBuf::from(exe)),
            _ => {}
        }
    }
    let [Some(plugin), Some(daemon)] = found else {
        return Err(format!(
            "{cmd:?} named no edgelink and edgelinkd executables"
        ));
    };
    Ok(BuiltBins {
        plugin: env_plugin.unwrap_or(plugin),
        daemon: env_daemon.unwrap_or(daemon),
    })
}

/// The cargo profile and `--target` this test binary was built with, read
/// from where it lives: `<dir>[/<triple>]/<profile dir>/deps/<test>-<hash>`.
/// The profile directory is `debug` for `dev` (and `test`), `release` for
/// `release` (and `bench`), else the profile's name. A `<triple>` level is
/// there when the directory above it is cargo's (holds `CACHEDIR.TAG`).
fn test_profile() -> (String, Option<String>) {
    let exe = std::env::current_exe().unwrap_or_default();
    let profile_dir = exe.parent().and_then(|deps| deps.parent());
    let name = |p: Option<&std::path::Path>| {
        p.and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
    };
    let profile = match name(profile_dir).as_deref() {
        None | Some("debug") => "dev".to_string(),
        Some(other) => other.to_string(),
    };
    let above = profile_dir.and_then(|p| p.parent());
    let target = match above {
        Some(a)
            if !a.join("CACHEDIR.TAG").exists()
                && a.parent().is_some_and(|t| t.join("CACHEDIR.TAG").exists()) =>
        {
            name(Some(a))
        }
        _ => None,
    };
    (profile, target)
}

/// What one plugin invocation produced.
#[derive(Debug)]
pub struct CniOutput {
    pub status: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl CniOutput {
    pub fn json(&self) -> Value {
        serde_json::from_str(self.stdout.trim()).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}): {:?}\nstderr: {}",
                self.stdout, self.stderr
            )
        })
    }

    /// The Result of a successful command.
    pub fn ok(&self) -> Value {
        assert_eq!(
            self.status,
            Some(0),
            "plugin failed: {}\nstderr: {}",
            self.stdout,
            self.stderr
        );
        self.json()
    }

    /// Success with empty stdout (DEL, CHECK, STATUS, GC).
    pub fn ok_empty(&self) {
        assert_eq!(
            self.status,
            Some(0),
            "plugin failed: {}\nstderr: {}",
            self.stdout,
            self.stderr
        );
        assert!(
            self.stdout.trim().is_empty(),
            "unexpected stdout: {}",
            self.stdout
        );
    }

    /// The CNI error of a failed command: (code, msg). Checks the error
    /// JSON is on stdout and the exit status is non-zero.
    pub fn err(&self) -> (u64, String) {
        assert_ne!(
            self.status,
            Some(0),
            "expected a failure, got: {}",
            self.stdout
        );
        let j = self.json();
        let code = j["code"]
            .as_u64()
            .unwrap_or_else(|| panic!("no code in {j}"));
        assert!(j["cniVersion"].is_string(), "error without cniVersion: {j}");
        (code, j["msg"].as_str().unwrap_or_default().to_string())
    }
}

/// One invocation, as a runtime makes it.
pub struct Call<'a> {
    pub command: &'a str,
    pub container_id: &'a str,
    pub netns: Option<&'a str>,
    pub ifname: &'a str,
    pub args: &'a str,
    pub path: &'a str,
    /// Extra environment (e.g. EDGELINK_DEBUG_STALL).
    pub extra_env: Vec<(&'a str, &'a str)>,
}

impl<'a> Call<'a> {
    pub fn new(
        command: &'a str,
        container_id: &'a str,
        netns: Option<&'a str>,
        ifname: &'a str,
    ) -> Call<'a> {
        Call {
            command,
            container_id,
            netns,
            ifname,
            args: "",
            path: "/usr/lib/cni",
            extra_env: Vec::new(),
        }
    }

    pub fn args(mut self, args: &'a str) -> Self {
        self.args = args;
        self
    }

    /// Build the process (inside `node`), not yet started.
    pub fn command(&self, node: &Netns, stdin_is_piped: bool) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &node.name])
            .arg(plugin_bin())
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("CNI_COMMAND", self.command)
            .env("CNI_CONTAINERID", self.container_id)
            .env("CNI_NETNS", self.netns.unwrap_or(""))
            .env("CNI_IFNAME", self.ifname)
            .env("CNI_ARGS", self.args)
            .env("CNI_PATH", self.path)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in &self.extra_env {
            c.env(k, v);
        }
        if stdin_is_piped {
            c.stdin(Stdio::piped());
        }
        c
    }

    /// Run with `stdin` and wait.
    pub fn run_raw(&self, node: &Netns, stdin: &[u8]) -> CniOutput {
        self.finish(self.command(node, true), stdin)
    }

    /// Start `cmd`, write `stdin`, wait. After a DEL, also wait (up to 5 s)
    /// for the interface it retired in CNI_NETNS: with a daemon running,
    /// DEL hands it over and the daemon deletes it a moment later, so what
    /// a test sees next is what DEL leaves. A retired interface still there
    /// after 5 s stays, and the test's own assertions see it.
    fn finish(&self, mut cmd: Command, stdin: &[u8]) -> CniOutput {
        self.node_state_dir(&mut cmd, stdin);
        let mut child = cmd.spawn().expect("spawn plugin");
        child.stdin.take().unwrap().write_all(stdin).unwrap();
        let out = child.wait_with_output().unwrap();
        if self.command == "DEL" {
            if let Some(name) = self.netns.and_then(|p| p.strip_prefix("/var/run/netns/")) {
                let retired = || {
                    Command::new("ip")
                        .args(["-n", name, "-o", "link", "show"])
                        .output()
                        .map(|o| String::from_utf8_lossy(&o.stdout).contains(RETIRED_ALIAS))
                        .unwrap_or(false)
                };
                wait_until(std::time::Duration::from_secs(5), || !retired());
            }
        }
        CniOutput {
            status: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    pub fn run(&self, node: &Netns, conf: &Value) -> CniOutput {
        self.run_raw(node, conf.to_string().as_bytes())
    }

    /// The node's state directory, as root sets it in a runtime's
    /// environment: `EDGELINK_STATE_DIR` is the `stateDir` of the config
    /// on stdin (the lab's), unless the test sets it itself. The plugin
    /// refuses a `stateDir` that is not its node's (docs/security.md).
    fn node_state_dir(&self, cmd: &mut Command, stdin: &[u8]) {
        if self.extra_env.iter().any(|(k, _)| *k == STATE_DIR_ENV) {
            return;
        }
        let conf: Option<Value> = serde_json::from_slice(stdin).ok();
        if let Some(dir) = conf.as_ref().and_then(|c| c["stateDir"].as_str()) {
            cmd.env(STATE_DIR_ENV, dir);
        }
    }
}

/// The plugin's environment variable for the node's state directory.
pub const STATE_DIR_ENV: &str = "EDGELINK_STATE_DIR";

/// The node policy a lab writes into its state directory: the uplinks its
/// tests cable (`uplink0`, `uplink1`) and the bridge some create before the
/// plugin runs (`edge0`). Tests of the policy write their own.
pub const LAB_POLICY: &str = r#"{"uplinks": ["uplink0", "uplink1"], "bridges": ["edge0"]}"#;

/// Write `policy` as the node policy of `state_dir` (0644, root's).
pub fn write_node_policy(state_dir: &std::path::Path, policy: &str) {
    std::fs::write(state_dir.join("node-policy.json"), policy).expect("write node-policy.json");
}

/// An edge node on one machine: a "node" namespace whose `uplink0` is
/// cabled (veth) to a "device" namespace at 172.31.250.10/24 and
/// fd00:e1::10/64, plus a state directory.
pub struct Lab {
    pub node: Netns,
    pub device: Netns,
    pub state: tempfile::TempDir,
}

pub const DEVICE_V4: &str = "172.31.250.10";
pub const DEVICE_V6: &str = "fd00:e1::10";

impl Lab {
    pub fn new() -> Lab {
        let node = Netns::new("node");
        let device = Netns::new("dev");
        node.ip(&[
            "link",
            "add",
            "uplink0",
            "type",
            "veth",
            "peer",
            "name",
            "dev0",
            "netns",
            &device.name,
        ]);
        device.ip(&["addr", "add", &format!("{DEVICE_V4}/24"), "dev", "dev0"]);
        device.ip(&[
            "addr",
            "add",
            &format!("{DEVICE_V6}/64"),
            "dev",
            "dev0",
            "nodad",
        ]);
        device.ip(&["link", "set", "dev0", "up"]);
        node.ip(&["link", "set", "uplink0", "up"]);
        let state = tempfile::tempdir().expect("tempdir");
        write_node_policy(state.path(), LAB_POLICY);
        Lab {
            node,
            device,
            state,
        }
    }

    pub fn state_dir(&self) -> String {
        self.state.path().display().to_string()
    }

    /// A new pod namespace.
    pub fn pod(&self) -> Netns {
        Netns::new("pod")
    }

    /// The design's bridge example, pointed at this lab.
    pub fn bridge_conf(&self, version: &str) -> Value {
        json!({
            "cniVersion": version,
            "name": "plant-floor",
            "type": "edgelink",
            "mode": "bridge",
            "bridge": "edge0",
            "uplink": "uplink0",
            "stateDir": self.state_dir(),
            "ipam": {
                "ranges": [[{"subnet": "172.31.250.0/24", "rangeStart": "172.31.250.100",
                             "rangeEnd": "172.31.250.150", "gateway": "172.31.250.1"}]],
                "routes": [{"dst": "172.30.0.0/16"}],
                "nodeName": "kedge1"
            },
            "forwards": [
                {"name": "api", "protocol": "tcp", "port": 8080, "target": format!("{DEVICE_V4}:8080")},
                {"name": "telemetry", "protocol": "udp", "port": 5000, "target": format!("{DEVICE_V4}:5000")}
            ]
        })
    }

    pub fn macvlan_conf(&self, version: &str) -> Value {
        let mut c = self.bridge_conf(version);
        c["mode"] = json!("macvlan");
        c.as_object_mut().unwrap().remove("bridge");
        c["macvlanMode"] = json!("bridge");
        c
    }

    /// Reserved addresses in the built-in store of `network` (files named
    /// like an IP address).
    pub fn reserved(&self, network: &str) -> Vec<String> {
        ip_files(&self.state.path().join("ipam").join(network))
    }

    /// Attachment record files.
    pub fn records(&self) -> Vec<String> {
        let dir = self.state.path().join("attachments");
        let Ok(rd) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        rd.filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".json") && !n.starts_with('.'))
            .collect()
    }

    /// Links in the node namespace other than lo, uplink0 and `keep`.
    pub fn node_extra_links(&self, keep: &[&str]) -> Vec<String> {
        self.node
            .links()
            .into_iter()
            .filter(|l| l != "lo" && l != "uplink0" && !keep.contains(&l.as_str()))
            .collect()
    }
}

impl Default for Lab {
    fn default() -> Self {
        Lab::new()
    }
}

/// Put `result` into `conf` as `prevResult` (for CHECK and DEL).
pub fn with_prev(conf: &Value, result: &Value) -> Value {
    let mut c = conf.clone();
    c["prevResult"] = result.clone();
    c
}

/// TCP connect from inside `ns` to `addr` with a short timeout (python3,
/// always present); true if the connection was accepted.
pub fn tcp_reachable(ns: &Netns, host: &str, port: u16) -> bool {
    let script = format!(
        "import socket,sys\ns=socket.socket(socket.AF_INET6 if ':' in '{host}' else socket.AF_INET)\ns.settimeout(2)\ntry:\n s.connect(('{host}',{port}))\nexcept ConnectionRefusedError:\n sys.exit(0)\nexcept Exception:\n sys.exit(1)\n"
    );
    // A refused connection proves the path works as well as an accepted one.
    ns.exec(&["python3", "-c", &script]).status.success()
}

// ---------------------------------------------------------------------------
// Helpers for the error, macvlan and runtime scenarios.

impl Call<'_> {
    /// Run with `stdin` after removing the variables in `unset` from the
    /// environment altogether (not just emptied), as a careless caller would.
    pub fn run_unset(&self, node: &Netns, unset: &[&str], stdin: &[u8]) -> CniOutput {
        let mut cmd = self.command(node, true);
        for k in unset {
            cmd.env_remove(k);
        }
        self.finish(cmd, stdin)
    }
}

impl Netns {
    /// The MAC address of `dev` (lower case), from `ip -o link show`.
    pub fn mac(&self, dev: &str) -> String {
        let out = self.ip(&["-o", "link", "show", "dev", dev]);
        let mut it = out.split_whitespace();
        it.find(|w| *w == "link/ether")
            .and_then(|_| it.next())
            .unwrap_or_else(|| panic!("no MAC for {dev} in {out}"))
            .to_lowercase()
    }

    /// The MTU of `dev`.
    pub fn mtu(&self, dev: &str) -> u32 {
        let out = self.ip(&["-o", "link", "show", "dev", dev]);
        let mut it = out.split_whitespace();
        it.find(|w| *w == "mtu")
            .and_then(|_| it.next())
            .and_then(|m| m.parse().ok())
            .unwrap_or_else(|| panic!("no MTU for {dev} in {out}"))
    }

    /// The controller (`master`) of `dev`, if it is enslaved.
    pub fn master_of(&self, dev: &str) -> Option<String> {
        let out = self.ip(&["-o", "link", "show", "dev", dev]);
        let mut it = out.split_whitespace();
        it.find(|w| *w == "master")
            .and_then(|_| it.next())
            .map(str::to_string)
    }

    /// `ip -d -o link show dev X`: kind-specific details (macvlan mode, ...).
    pub fn link_details(&self, dev: &str) -> String {
        self.ip(&["-d", "-o", "link", "show", "dev", dev])
    }

    /// Link names, sorted (for before/after comparisons).
    pub fn links_sorted(&self) -> Vec<String> {
        let mut l = self.links();
        l.sort();
        l
    }
}

impl Lab {
    /// Reserved addresses of every network in the built-in store, as
    /// "network/address", sorted.
    pub fn reserved_all(&self) -> Vec<String> {
        let root = self.state.path().join("ipam");
        let Ok(rd) = std::fs::read_dir(root) else {
            return Vec::new();
        };
        let mut v: Vec<String> = rd
            .filter_map(|e| e.ok())
            .filter(|e| e.path().is_dir())
            .flat_map(|e| {
                let net = e.file_name().to_string_lossy().into_owned();
                self.reserved(&net)
                    .into_iter()
                    .map(move |ip| format!("{net}/{ip}"))
            })
            .collect();
        v.sort();
        v
    }

    /// Attachment record files, sorted.
    pub fn records_sorted(&self) -> Vec<String> {
        let mut r = self.records();
        r.sort();
        r
    }
}

// ---------------------------------------------------------------------------
// Helpers for the IPAM, crash, lifecycle and bridge-option scenarios.

/// Poll `cond` every 20 ms until it holds or `timeout` has passed; returns
/// whether it held.
pub fn wait_until(timeout: std::time::Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = std::time::Instant::now();
    loop {
        if cond() {
            return true;
        }
        if start.elapsed() >= timeout {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Run `f(0..n)` on `n` threads at once (started together behind a
/// barrier); results in index order.
pub fn run_parallel<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let barrier = std::sync::Barrier::new(n);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let (f, barrier) = (&f, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    f(i)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("worker thread panicked"))
            .collect()
    })
}

/// A plugin process started in the background (for killing it half-way).
/// Its stderr is collected by a thread; dropping it kills and reaps the
/// process if it still runs.
pub struct Running {
    child: std::process::Child,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Running {
    /// Start `call` inside `node` with `conf` on stdin (stdin is closed
    /// after writing, as a runtime does).
    pub fn start(call: &Call<'_>, node: &Netns, conf: &Value) -> Running {
        let mut cmd = call.command(node, true);
        call.node_state_dir(&mut cmd, conf.to_string().as_bytes());
        let mut child = cmd.spawn().expect("spawn plugin");
        {
            let mut stdin = child.stdin.take().expect("piped stdin");
            stdin
                .write_all(conf.to_string().as_bytes())
                .expect("write stdin");
        }
        let mut err = child.stderr.take().expect("piped stderr");
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let sink = stderr.clone();
        let reader = std::thread::spawn(move || {
            use std::io::Read;
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Running {
            child,
            stderr,
            reader: Some(reader),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the process wrote on stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Wait (bounded) until stderr contains `needle`.
    pub fn wait_stderr(&self, needle: &str, timeout: std::time::Duration) -> bool {
        wait_until(timeout, || self.stderr().contains(needle))
    }

    /// The process's command name (`/proc/<pid>/comm`), while it runs.
    pub fn comm(&self) -> String {
        std::fs::read_to_string(format!("/proc/{}/comm", self.pid()))
            .unwrap_or_default()
            .trim()
            .to_string()
    }

    /// SIGKILL the process and reap it; returns the signal that ended it.
    pub fn kill9(mut self) -> Option<i32> {
        use std::os::unix::process::ExitStatusExt;
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        let status = self.child.wait().expect("reap plugin");
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        status.signal()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Netns {
    /// A sysctl of this namespace, read from /proc/sys inside it
    /// (`net.ipv4.ip_forward` style key).
    pub fn sysctl(&self, key: &str) -> String {
        let path = format!("/proc/sys/{}", key.replace('.', "/"));
        let out = self.exec(&["cat", &path]);
        assert!(
            out.status.success(),
            "read {path} in {}: {}",
            self.name,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Set a sysctl inside this namespace.
    pub fn set_sysctl(&self, key: &str, value: &str) {
        let path = format!("/proc/sys/{}", key.replace('.', "/"));
        let out = self.exec(&["sh", "-c", &format!("echo {value} > {path}")]);
        assert!(
            out.status.success(),
            "write {path} in {}: {}",
            self.name,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Whether this kernel supports bridge VLAN filtering, tried in a scratch
/// namespace: `Err(reason)` when it does not.
pub fn bridge_vlan_filtering_supported() -> Result<(), String> {
    let ns = Netns::new("scratch");
    let out = ns.ip_try(&[
        "link",
        "add",
        "brvlan",
        "type",
        "bridge",
        "vlan_filtering",
        "1",
    ]);
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

impl Lab {
    /// Node-side veths of bridge attachments (`elk` + 12 hex digits).
    pub fn host_veths(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .node
            .links()
            .into_iter()
            .filter(|l| l.len() == 15 && l.starts_with("elk"))
            .collect();
        v.sort();
        v
    }

    /// `conf` turned into a GC request (cniVersion 1.1.0) keeping `valid`
    /// (container ID, ifname) attachments.
    pub fn gc_conf(conf: &Value, valid: &[(&str, &str)]) -> Value {
        let mut c = conf.clone();
        c["cniVersion"] = json!("1.1.0");
        c["cni.dev/valid-attachments"] = valid
            .iter()
            .map(|(cid, ifname)| json!({"containerID": cid, "ifname": ifname}))
            .collect();
        c
    }
}

/// The daemon under test: `$EDGELINKD_BIN`, else the workspace's current
/// `edgelinkd`, built by [`built_bins`] first.
pub fn daemon_bin() -> PathBuf {
    if let Ok(p) = std::env::var("EDGELINKD_BIN") {
        return PathBuf::from(p);
    }
    built_bins().daemon.clone()
}

impl Lab {
    /// Start the node daemon for this lab (needed by CHECK when the
    /// attachment has forwards); its log is `<state>/edgelinkd.log`. The
    /// reconcile interval is the default (30 s): records reach it through
    /// the inotify watch and the plugin's `rescan` nudge, as on a node.
    pub fn daemon(&self) -> Edgelinkd {
        Edgelinkd::start(
            &self.node,
            self.state.path(),
            self.state.path().join("edgelinkd.log"),
            &["--probe-interval", "0"],
        )
    }
}

// ---------------------------------------------------------------------------
// Helpers for the daemon scenarios: code and sockets inside a namespace
// without a subprocess, an HTTP client, and a daemon whose log goes to a
// file (a piped stderr that nobody reads would stall a chatty daemon).

/// Run `f` on a short-lived thread inside `ns` (sockets it creates stay in
/// `ns` whichever thread uses them afterwards). The calling thread never
/// changes namespace.
pub fn in_netns<T: Send>(ns: &Netns, f: impl FnOnce() -> T + Send) -> T {
    edgelink_netns::Netns::open(ns.path())
        .unwrap_or_else(|e| panic!("open {}: {e}", ns.name))
        .run_on_thread(f)
        .unwrap_or_else(|e| panic!("run inside {}: {e}", ns.name))
}

/// One blocking socket call, made again when it was interrupted.
///
/// With a timeout on the socket (SO_RCVTIMEO/SO_SNDTIMEO), Linux fails
/// `read`, `write`, `recv*`, `send*` and `accept` with EINTR when this
/// process is stopped and continued, even without a signal handler
/// (signal(7)). A CI machine that pauses the test process does exactly
/// that. std retries EINTR in `read_exact` and `write_all`, not in the
/// single calls: wrap those in `again(|| s.read(&mut buf))`.
pub fn again<T>(mut f: impl FnMut() -> std::io::Result<T>) -> std::io::Result<T> {
    loop {
        match f() {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}

/// TCP connect from inside `ns` (bounded by `timeout`).
pub fn connect_in(
    ns: &Netns,
    addr: std::net::SocketAddr,
    timeout: std::time::Duration,
) -> std::io::Result<std::net::TcpStream> {
    in_netns(ns, || std::net::TcpStream::connect_timeout(&addr, timeout))
}

/// A tokio runtime whose every thread (workers and blocking pool) lives in
/// one network namespace: sockets made by its tasks belong there. Futures
/// only ever run on those threads ([`NsRuntime::run`] spawns, then waits),
/// never on the caller's.
pub struct NsRuntime {
    rt: Option<tokio::runtime::Runtime>,
}

impl NsRuntime {
    pub fn new(ns: &Netns, workers: usize) -> NsRuntime {
        let handle = std::sync::Arc::new(
            edgelink_netns::Netns::open(ns.path())
                .unwrap_or_else(|e| panic!("open {}: {e}", ns.name)),
        );
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .max_blocking_threads(4)
            .enable_all()
            .thread_name(format!("rt-{}", ns.name))
            .on_thread_start(move || {
                if let Err(e) = nix::sched::setns(&*handle, nix::sched::CloneFlags::CLONE_NEWNET) {
                    // Running on in the test's own namespace could send
                    // traffic where it must not go.
                    eprintln!("fatal: cannot enter the test namespace: {e}");
                    std::process::abort();
                }
            })
            .build()
            .expect("tokio runtime");
        NsRuntime { rt: Some(rt) }
    }

    fn rt(&self) -> &tokio::runtime::Runtime {
        self.rt.as_ref().expect("runtime")
    }

    /// Run `f` on the namespace's threads and wait for its output.
    pub fn run<F>(&self, f: F) -> F::Output
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let rt = self.rt();
        rt.block_on(rt.spawn(f)).expect("task panicked")
    }

    /// Start `f` on the namespace's threads.
    pub fn spawn<F>(&self, f: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.rt().spawn(f)
    }

    /// Wait for a task started with [`NsRuntime::spawn`] (from sync code).
    pub fn join<T>(&self, h: tokio::task::JoinHandle<T>) -> T {
        self.rt().block_on(h).expect("task panicked")
    }
}

impl Drop for NsRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(std::time::Duration::from_secs(2));
        }
    }
}

/// Raise RLIMIT_NOFILE's soft limit to the hard limit (children inherit it);
/// returns the new soft limit.
pub fn raise_nofile() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct we own.
    unsafe {
        assert_eq!(
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim),
            0,
            "getrlimit"
        );
        lim.rlim_cur = lim.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0, "setrlimit");
    }
    lim.rlim_cur
}

/// An HTTP/1.1 request from inside `ns` (Connection: close): (status code,
/// headers, body). Panics on a transport error.
pub fn http_in(
    ns: &Netns,
    addr: &str,
    method: &str,
    path: &str,
    body: &[u8],
) -> (u16, String, String) {
    use std::io::Read;
    let sa: std::net::SocketAddr = addr.parse().expect("address");
    let mut s = connect_in(ns, sa, std::time::Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("connect {addr} in {}: {e}", ns.name));
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP status line in {head:?}"));
    (code, head.to_string(), body.to_string())
}

/// A running `edgelinkd run` inside a namespace, its stderr in a log file;
/// SIGKILLed and reaped on drop.
pub struct Edgelinkd {
    pub child: std::process::Child,
    pub log: PathBuf,
    pub node: String,
    pub state_dir: PathBuf,
    /// Its HTTP endpoint inside `node`.
    pub status_addr: String,
}

impl Edgelinkd {
    /// Start it in `node` (status on 127.0.0.1:9310 there) with `extra`
    /// flags; returns once the control socket exists (bounded).
    pub fn start(
        node: &Netns,
        state_dir: &std::path::Path,
        log: PathBuf,
        extra: &[&str],
    ) -> Edgelinkd {
        Edgelinkd::start_with_nofile(node, state_dir, log, extra, None)
    }

    /// [`Edgelinkd::start`], with the soft RLIMIT_NOFILE it starts with
    /// set to `soft` (as a service manager or container runtime may).
    pub fn start_with_nofile(
        node: &Netns,
        state_dir: &std::path::Path,
        log: PathBuf,
        extra: &[&str],
        soft: Option<u64>,
    ) -> Edgelinkd {
        let sock = state_dir.join("edgelinkd.sock");
        let _ = std::fs::remove_file(&sock);
        let mut d = Edgelinkd::spawn(node, state_dir, log, extra, soft);
        let up = wait_until(std::time::Duration::from_secs(10), || {
            sock.exists() || !d.running()
        });
        assert!(
            up && d.running(),
            "edgelinkd did not come up: {}",
            d.log_text()
        );
        d
    }

    /// Start one with `--takeover` (and `extra`) on the state dir of a
    /// running one; returns once it logged that it took over (bounded),
    /// or once it ended.
    pub fn take_over(
        node: &Netns,
        state_dir: &std::path::Path,
        log: PathBuf,
        extra: &[&str],
    ) -> Edgelinkd {
        let mut flags = vec!["--takeover"];
        flags.extend_from_slice(extra);
        let mut d = Edgelinkd::spawn(node, state_dir, log, &flags, None);
        wait_until(std::time::Duration::from_secs(20), || {
            let log = d.log_text();
            log.contains("took over") || log.contains("idle until stopped") || !d.running()
        });
        d
    }

    /// Spawn it, without waiting for anything.
    fn spawn(
        node: &Netns,
        state_dir: &std::path::Path,
        log: PathBuf,
        extra: &[&str],
        soft: Option<u64>,
    ) -> Edgelinkd {
        let status_addr = "127.0.0.1:9310".to_string();
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("daemon log file");
        // The machine's own /etc/resolv.conf is no test's business (on a
        // CI runner in a Kubernetes pod it is a cluster file): off unless
        // a test names one.
        let own_resolver: &[&str] = if extra.iter().any(|a| a.starts_with("--cluster-resolv-conf"))
        {
            &[]
        } else {
            &["--cluster-resolv-conf="]
        };
        let mut child = Command::new("ip");
        child
            .args(["netns", "exec", &node.name])
            .arg(daemon_bin())
            .args(["run", "--state-dir"])
            .arg(state_dir)
            .args(["--status-addr", &status_addr, "--log-level", "debug"])
            .args(own_resolver)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(file));
        if let Some(soft) = soft {
            use std::os::unix::process::CommandExt;
            // SAFETY: between fork and exec only async-signal-safe calls
            // (getrlimit, setrlimit) on a struct owned by the closure.
            unsafe {
                child.pre_exec(move || {
                    let mut lim = libc::rlimit {
                        rlim_cur: 0,
                        rlim_max: 0,
                    };
                    if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    lim.rlim_cur = soft.min(lim.rlim_max);
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = child.spawn().expect("spawn edgelinkd");
        Edgelinkd {
            child,
            log,
            node: node.name.clone(),
            state_dir: state_dir.to_path_buf(),
            status_addr,
        }
    }

    pub fn pid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(self.child.id() as i32)
    }

    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        let _ = nix::sys::signal::kill(self.pid(), sig);
    }

    /// SIGKILL and reap.
    pub fn kill9(&mut self) {
        if self.running() {
            self.signal(nix::sys::signal::Signal::SIGKILL);
        }
        let _ = self.child.wait();
    }

    /// Wait (bounded) for the process to end.
    pub fn wait_exit(&mut self, timeout: std::time::Duration) -> Option<std::process::ExitStatus> {
        let mut st = None;
        wait_until(timeout, || {
            st = self.child.try_wait().ok().flatten();
            st.is_some()
        });
        st
    }
}

impl Drop for Edgelinkd {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A child process killed and reaped on drop.
pub struct ChildGuard(Option<std::process::Child>);

impl ChildGuard {
    pub fn new(child: std::process::Child) -> ChildGuard {
        ChildGuard(Some(child))
    }

    pub fn child(&mut self) -> &mut std::process::Child {
        self.0.as_mut().expect("child")
    }

    /// Wait (bounded) for it to end and collect its output; kills it when
    /// the time is up (then `None`).
    pub fn wait_output(mut self, timeout: std::time::Duration) -> Option<Output> {
        let done = wait_until(timeout, || matches!(self.child().try_wait(), Ok(Some(_))));
        if !done {
            return None;
        }
        self.0.take()?.wait_with_output().ok()
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            if matches!(c.try_wait(), Ok(None)) {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
    }
}

impl Lab {
    /// Make every file of the IPAM store and every attachment record look
    /// written an hour ago (their mtime), as if the ADDs that wrote them
    /// had finished long ago: GC keeps younger ones (an ADD in flight).
    pub fn age_state(&self) {
        let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        fn walk(dir: &std::path::Path, t: std::time::SystemTime) {
            let Ok(rd) = std::fs::read_dir(dir) else {
                return;
            };
            for e in rd.filter_map(|e| e.ok()) {
                let Ok(ft) = e.file_type() else { continue };
                if ft.is_dir() {
                    walk(&e.path(), t);
                } else if ft.is_file() {
                    if let Ok(f) = std::fs::File::options().write(true).open(e.path()) {
                        let _ = f.set_modified(t);
                    }
                }
            }
        }
        walk(&self.state.path().join("ipam"), hour_ago);
        walk(&self.state.path().join("attachments"), hour_ago);
    }
}

/// The names of the files in `dir` that are IP addresses, sorted: the
/// reservations of the built-in IPAM, or of host-local. None if `dir` is
/// missing.
pub fn ip_files(dir: &std::path::Path) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<String> = rd
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
        .collect();
    v.sort();
    v
}
pub mod dns;
