//! `edgelinkd`'s command line: bad flags are refused before anything is
//! bound.

use edgelink_tests::*;

#[test]
fn a_bad_flag_exits_64_with_a_message_naming_it() {
    // In a namespace of its own: were a flag accepted, nothing of the host
    // would be bound.
    let ns = Netns::new("flags");
    let state = tempfile::tempdir().unwrap();
    let sd = state.path().display().to_string();
    let bin = daemon_bin().display().to_string();
    let cases: &[(&[&str], &str)] = &[
        (
            &["run", "--state-dir", &sd, "--no-such-flag"],
            "--no-such-flag",
        ),
        (&["run", "--state-dir", "relative/dir"], "--state-dir"),
        (
            &["run", "--state-dir", &sd, "--cni-path", "opt/cni/bin"],
            "--cni-path",
        ),
        (
            &[
                "run",
                "--state-dir",
                &sd,
                "--cni-path",
                "/usr/lib/cni:/no/such/dir",
            ],
            "--cni-path",
        ),
        (
            &["run", "--state-dir", &sd, "--status-addr", "localhost"],
            "--status-addr",
        ),
        (
            &["run", "--state-dir", &sd, "--reconcile-interval", "soon"],
            "--reconcile-interval",
        ),
        (
            &["run", "--state-dir", &sd, "--reconcile-interval", "0"],
            "--reconcile-interval",
        ),
        (
            &["run", "--state-dir", &sd, "--udp-idle-timeout", "0"],
            "--udp-idle-timeout",
        ),
        (
            &["run", "--state-dir", &sd, "--grace-period=-1"],
            "--grace-period",
        ),
        (
            &["run", "--state-dir", &sd, "--grace-period", "forever"],
            "--grace-period",
        ),
        (
            &["run", "--state-dir", &sd, "--pipe-size", "12"],
            "--pipe-size",
        ),
        (
            &["run", "--state-dir", &sd, "--udp-max-sessions", "0"],
            "--udp-max-sessions",
        ),
        (
            &["run", "--state-dir", &sd, "--bulk-lowat", "99999999"],
            "--bulk-lowat",
        ),
        (
            &["run", "--state-dir", &sd, "--bulk-lowat", "lots"],
            "--bulk-lowat",
        ),
        (
            &["run", "--state-dir", &sd, "--udp-gso", "maybe"],
            "--udp-gso",
        ),
        (
            &["run", "--state-dir", &sd, "--log-level", "loud"],
            "--log-level",
        ),
        (
            &[
                "run",
                "--state-dir",
                &sd,
                "--status-webhook",
                "https://x/hook",
            ],
            "--status-webhook",
        ),
        (
            &[
                "run",
                "--state-dir",
                &sd,
                "--status-webhook-token-file",
                "token",
            ],
            "--status-webhook-token-file",
        ),
        (
            &[
                "run",
                "--state-dir",
                &sd,
                "--status-webhook-interval",
                "often",
            ],
            "--status-webhook-interval",
        ),
        (
            &[
                "run",
                "--state-dir",
                &sd,
                "--status-webhook-file",
                "etc/url",
            ],
            "--status-webhook-file",
        ),
        (
            &[
                "run",
                "--state-dir",
                &sd,
                "--status-webhook",
                "http://127.0.0.1:1/",
                "--status-webhook-file",
                "/etc/url",
            ],
            "--status-webhook-file",
        ),
        (
            &["run", "--state-dir", &sd, "--metrics-addr", "9311"],
            "--metrics-addr",
        ),
        (
            &["run", "--state-dir", &sd, "--log-format", "xml"],
            "--log-format",
        ),
        (&["status", "--status-addr", "nowhere"], "--status-addr"),
        (&["frobnicate"], "frobnicate"),
    ];
    for (args, named) in cases {
        let mut full = vec![bin.as_str()];
        full.extend_from_slice(args);
        let out = ns.exec(&full);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {err}");
        assert!(
            err.contains(named),
            "{args:?}: the message does not name {named}: {err}"
        );
        assert!(
            out.stdout.is_empty(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    // Nothing was created or bound.
    assert!(std::fs::read_dir(state.path()).unwrap().next().is_none());
    // --help is not an error.
    let out = ns.exec(&[&bin, "run", "--help"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("--reconcile-interval"));
}
