//! Where edgelinkd's settings come from (issue 21): a config file, the
//! environment, flags over both; durations with units; JSON logs; the
//! metrics address; the version with its commit. Each daemon runs in a
//! namespace of the test's own.

use crate::lab::*;
use edgelink_tests::*;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// `edgelinkd run --state-dir STATE ARGS` in `ns` with `env`, its stderr in
/// a log; killed on drop. Not waited for.
fn spawn(ns: &Netns, state: &Path, args: &[&str], env: &[(&str, &str)]) -> Edgelinkd {
    let log = state.with_extension("log");
    let file = std::fs::File::create(&log).unwrap();
    let child = Command::new("ip")
        .args(["netns", "exec", &ns.name])
        .arg(daemon_bin())
        .args(["run", "--state-dir"])
        .arg(state)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(file)
        .spawn()
        .expect("spawn edgelinkd");
    Edgelinkd {
        child,
        log,
        node: ns.name.clone(),
        state_dir: state.to_path_buf(),
        status_addr: String::new(),
    }
}

/// `edgelinkd run --state-dir STATE ARGS` in `ns`, waited for: for runs
/// that exit at once (refused, or `--help`).
fn run_to_exit(ns: &Netns, state: &Path, args: &[&str]) -> std::process::Output {
    let bin = daemon_bin();
    let mut full = vec![
        bin.to_str().unwrap(),
        "run",
        "--state-dir",
        state.to_str().unwrap(),
    ];
    full.extend_from_slice(args);
    ns.exec(&full)
}

/// Whether something answers HTTP on `addr` in `ns` within 10 s.
fn answers(ns: &Netns, addr: &str) -> bool {
    let sa: std::net::SocketAddr = addr.parse().unwrap();
    wait_until(Duration::from_secs(10), || {
        connect_in(ns, sa, Duration::from_millis(200)).is_ok()
    })
}

fn refused(ns: &Netns, addr: &str) -> bool {
    let sa: std::net::SocketAddr = addr.parse().unwrap();
    connect_in(ns, sa, Duration::from_millis(500)).is_err()
}

#[test]
fn the_config_file_sets_what_no_flag_or_variable_does_and_each_overrides_it() {
    let ns = Netns::new("settings");
    ns.ip(&["link", "set", "lo", "up"]);
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("edgelinkd.yaml");
    std::fs::write(
        &conf,
        "# as docs/configuration.md shows it\n\
         status-addr: 127.0.0.1:9401\n\
         log-format: json\n\
         log-level: debug\n\
         reconcile-interval: 1m\n\
         tcp-idle-timeout: 1h30m\n\
         udp-gso: false\n",
    )
    .unwrap();
    let conf = conf.to_str().unwrap();
    let state = dir.path().join("state");

    // The file alone: its address, its log format.
    let d = spawn(&ns, &state, &["--config", conf], &[]);
    assert!(answers(&ns, "127.0.0.1:9401"), "{}", d.log_text());
    let (code, _, _) = http_in(&ns, "127.0.0.1:9401", "GET", "/status", b"");
    assert_eq!(code, 200);
    let log = d.log_text();
    let first = log
        .lines()
        .next()
        .unwrap_or_else(|| panic!("no log: {log}"));
    let j: serde_json::Value =
        serde_json::from_str(first).unwrap_or_else(|e| panic!("not JSON ({e}): {first}"));
    assert!(j["level"].is_string() && j["timestamp"].is_string(), "{j}");
    assert!(
        log.lines()
            .all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok()),
        "{log}"
    );
    drop(d);

    // A variable over the file, the file's other keys still holding: its
    // address, the variable's text log.
    let d = spawn(
        &ns,
        &state,
        &[],
        &[("EDGELINKD_CONFIG", conf), ("EDGELINKD_LOG_FORMAT", "text")],
    );
    assert!(answers(&ns, "127.0.0.1:9401"), "{}", d.log_text());
    let log = d.log_text();
    assert!(log.contains(" INFO ") && !log.starts_with('{'), "{log}");
    drop(d);

    // The file's address under a variable's.
    let d = spawn(
        &ns,
        &state,
        &["--config", conf],
        &[("EDGELINKD_STATUS_ADDR", "127.0.0.1:9402")],
    );
    assert!(answers(&ns, "127.0.0.1:9402"), "{}", d.log_text());
    assert!(refused(&ns, "127.0.0.1:9401"));
    drop(d);

    // A flag over both, a host name resolved.
    let d = spawn(
        &ns,
        &state,
        &["--config", conf, "--status-addr", "localhost:9403"],
        &[("EDGELINKD_STATUS_ADDR", "127.0.0.1:9402")],
    );
    assert!(answers(&ns, "127.0.0.1:9403"), "{}", d.log_text());
    assert!(refused(&ns, "127.0.0.1:9402"));
}

#[test]
fn a_config_file_that_names_no_flag_or_a_bad_value_is_refused_naming_it() {
    let ns = Netns::new("settings-bad");
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let cases: &[(&str, &[&str])] = &[
        (
            "max-conections: 5\n",
            &[
                "\"max-conections\" is not a setting of edgelinkd run",
                "did you mean \"max-connections\"",
            ],
        ),
        (
            "reconcile-interval: soon\n",
            &["--reconcile-interval", "soon"],
        ),
        ("forwards: [a, b]\n", &["\"forwards\" is not a setting"]),
        ("log-levle: debug\n", &["did you mean \"log-level\""]),
        (
            "workers: [1, 2]\n",
            &["workers: a list is not a single value"],
        ),
        ("1: 2\n", &["a key is a number, not a flag's name"]),
        ("- a list\n", &["not a mapping of settings"]),
    ];
    for (text, named) in cases {
        let conf = dir.path().join("bad.yaml");
        std::fs::write(&conf, text).unwrap();
        let out = run_to_exit(&ns, &state, &["--config", conf.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{text}: {err}");
        for n in *named {
            assert!(
                err.contains(n),
                "{text}: the message does not say {n:?}: {err}"
            );
        }
        assert!(!state.exists(), "{text}: the state dir was created");
    }
    // A missing file is named too.
    let out = ns.exec(&[
        daemon_bin().to_str().unwrap(),
        "run",
        "--config",
        "/no/such/edgelinkd.yaml",
    ]);
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/no/such/edgelinkd.yaml"));
}

#[test]
fn durations_take_units_and_bare_seconds() {
    let ns = Netns::new("settings-units");
    let state = tempfile::tempdir().unwrap();
    let sd = state.path().join("s");
    // --help after the values: clap checks every value first, then prints
    // the help and exits 0, binding nothing.
    for ok in [
        ["--grace-period", "20s"],
        ["--grace-period", "1.5"],
        ["--tcp-idle-timeout", "2h"],
        ["--connect-retry-backoff", "250ms"],
        ["--tcp-keepalive", "1m"],
    ] {
        let out = run_to_exit(&ns, &sd, &[ok[0], ok[1], "--help"]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{ok:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for bad in [
        ["--grace-period", "20 parsecs"],
        ["--tcp-keepalive", "1500ms"],
        ["--tcp-idle-timeout", "8d"],
        ["--grace-period", "2d"],
    ] {
        let out = run_to_exit(&ns, &sd, &[bad[0], bad[1]]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{bad:?}: {err}");
        assert!(err.contains(bad[0]), "{bad:?}: {err}");
    }
}

#[test]
fn the_metrics_address_serves_metrics_and_health_but_not_status() {
    let ns = Netns::new("settings-metrics");
    ns.ip(&["link", "set", "lo", "up"]);
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let d = spawn(
        &ns,
        &state,
        &[
            "--metrics-addr",
            "127.0.0.1:9411",
            "--status-addr",
            "127.0.0.1:9410",
        ],
        &[],
    );
    assert!(
        answers(&ns, "127.0.0.1:9411") && answers(&ns, "127.0.0.1:9410"),
        "{}",
        d.log_text()
    );

    let (code, _, body) = http_in(&ns, "127.0.0.1:9411", "GET", "/metrics", b"");
    assert_eq!(code, 200, "{body}");
    let build = body
        .lines()
        .find(|l| l.starts_with("edgelink_build_info{"))
        .unwrap_or_else(|| panic!("no edgelink_build_info: {body}"));
    assert!(
        build.contains("version=\"") && build.contains("commit=\""),
        "{build}"
    );
    for m in [
        "process_cpu_seconds_total ",
        "process_resident_memory_bytes ",
        "process_open_fds ",
        "process_max_fds ",
        "process_start_time_seconds ",
    ] {
        assert!(body.lines().any(|l| l.starts_with(m)), "no {m}: {body}");
    }
    assert_eq!(body.matches("# EOF").count(), 1, "one exposition: {body}");
    assert!(body.ends_with("# EOF\n"));

    let (code, _, body) = http_in(&ns, "127.0.0.1:9411", "GET", "/status", b"");
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("--status-addr"), "{body}");
    let (code, _, _) = http_in(&ns, "127.0.0.1:9411", "GET", "/livez", b"");
    assert_ne!(code, 404);
    // The status address still has everything.
    let (code, _, _) = http_in(&ns, "127.0.0.1:9410", "GET", "/status", b"");
    assert_eq!(code, 200);
}

#[test]
fn version_names_the_commit() {
    let out = Command::new(daemon_bin())
        .arg("--version")
        .output()
        .unwrap();
    let v = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{v}");
    assert!(
        v.starts_with("edgelinkd 0.") && v.contains("(commit "),
        "{v}"
    );
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output();
    if let Some(h) = head.ok().filter(|h| h.status.success()) {
        let h = String::from_utf8_lossy(&h.stdout).trim().to_string();
        assert!(v.contains(&h), "{v} does not name HEAD {h}");
    }
}

/// The metrics address is bound with SO_REUSEPORT so that a daemon taking
/// over binds it while the one handing over still serves it (the status
/// address is handed over instead): a take-over with `--metrics-addr` comes
/// up, and the address answers afterwards, from the new daemon.
#[test]
fn a_take_over_binds_the_metrics_address_beside_the_old_daemon() {
    let mut l = DLab::with(Opts {
        flags: &["--metrics-addr", "127.0.0.1:9412"],
        ..Default::default()
    });
    assert!(
        answers(&l.lab.node, "127.0.0.1:9412"),
        "{}",
        l.daemon().log_text()
    );
    let old = l.daemon().pid();
    l.take_over();
    assert_ne!(l.daemon().pid(), old);
    let (code, _, body) = http_in(&l.lab.node, "127.0.0.1:9412", "GET", "/metrics", b"");
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("edgelink_build_info{"), "{body}");
    assert!(
        !l.daemon().log_text().contains("--metrics-addr"),
        "{}",
        l.daemon().log_text()
    );
}
